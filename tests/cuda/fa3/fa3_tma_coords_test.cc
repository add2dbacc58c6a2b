// fa3's TMA coordinate rule (kernels/tma_coords.h): a K/V map is used only where every box's
// token coordinate (kv_first + n * kBlockN, computed in 64 bits and narrowed as the producer
// does) is exact in TMA's signed 32-bit coordinates; larger tensors go to the cp.async path.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/tma_coords.h"

namespace kvattn::fa3 {
namespace {

TEST(Fa3TmaCoordinates, MapsOverMoreThanTwoToThe31TokensAreRefused) {
  EXPECT_FALSE(tma_token_coordinates_fit(0));
  EXPECT_TRUE(tma_token_coordinates_fit(1));
  EXPECT_TRUE(tma_token_coordinates_fit(int64_t(INT32_MAX)));
  EXPECT_FALSE(tma_token_coordinates_fit(int64_t(INT32_MAX) + 1));
  EXPECT_FALSE(tma_token_coordinates_fit(int64_t(1) << 40));
}

TEST(Fa3TmaCoordinates, EveryBoxStartOfAnAdmittedMapIsExactInInt32) {
  // The last request of a ragged K ending at the map's last token: its last box starts below
  // tokens, and the producer's narrowing keeps it exact.
  for (int head_dim : {64, 128, 256}) {
    const int bn = tile_shape(head_dim, head_dim, 2).block_n;  // TMA: 16-bit
    const int64_t tokens = INT32_MAX;
    const int64_t kv_len = 10 * int64_t(bn) + 7;
    const int64_t kv_first = tokens - kv_len;
    ASSERT_TRUE(tma_token_coordinates_fit(tokens));
    const int64_t blocks = (kv_len + bn - 1) / bn;
    for (int64_t n = 0; n < blocks; ++n) {
      const int64_t start = kv_first + n * bn;
      EXPECT_LT(start, tokens);
      EXPECT_EQ(int64_t(int(start)), start) << "head dim " << head_dim << ", block " << n;
    }
  }
}

}  // namespace
}  // namespace kvattn::fa3
