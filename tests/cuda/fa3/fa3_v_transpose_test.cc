// fa3's FP8 V transpose (src/cuda/fa3/kernels/v_transpose.h) replayed on the CPU as plain index
// functions: every unit of every warp, store by store. The stores write every byte of V^T exactly
// once, each from the key its column stands for (wgmma_fragment.h's renumbering) and the dim its
// row is; the XOR form of the store offsets equals tile_offset8; the 32 lanes of each store
// instruction hit 32 distinct banks.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/v_transpose.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"

namespace kvattn::fa3 {
namespace {

// byte_perm against the PTX ISA's prmt (default mode) written out: byte i of the result is byte
// sel_i & 7 of {b, a}.
TEST(Fa3VTranspose, BytePermIsPrmt) {
  const uint32_t a = 0x33221100u, b = 0x77665544u;
  for (uint32_t sel : {0x3210u, 0x7654u, 0x5140u, 0x7362u, 0x5410u, 0x7632u, 0x0123u, 0x4567u}) {
    uint32_t want = 0;
    for (int i = 0; i < 4; ++i) {
      const uint32_t idx = (sel >> (4 * i)) & 7u;
      want |= (0x11u * idx) << (8 * i);
    }
    EXPECT_EQ(vt::byte_perm(a, b, sel), want) << std::hex << sel;
  }
}

// transpose4 for every order: out[e] holds dim 4g + (e ^ order) of keys 0..3 (byte b = key b).
TEST(Fa3VTranspose, TransposeFourKeysInEveryOrder) {
  uint32_t k[4];
  for (int b = 0; b < 4; ++b) {
    k[b] = 0;
    for (int d = 0; d < 4; ++d) k[b] |= uint32_t(16 * b + d) << (8 * d);  // key b, dim d
  }
  for (int order = 0; order < 4; ++order) {
    uint32_t out[4];
    vt::transpose4(k[0], k[1], k[2], k[3], vt::selectors(order), out);
    for (int e = 0; e < 4; ++e) {
      for (int b = 0; b < 4; ++b) {
        EXPECT_EQ((out[e] >> (8 * b)) & 0xFFu, uint32_t(16 * b + (e ^ order)))
            << "order " << order << " word " << e << " byte " << b;
      }
    }
  }
}

// Every unit of every warp of the producer (4 warps x kUnits / 32 steps x 32 lanes), as
// prefill_cta.h's copy_v_transposed walks them: store j of piece word g writes, byte b, key row
// warp * BN / 4 + key_lane(quad, b) at dim store_dim(piece, j).
template <int BN, int VO>
void check_transpose() {
  const std::string what = "BN " + std::to_string(BN) + " VO " + std::to_string(VO);
  constexpr int kUnits = vt::kWarpQuads<BN> * VO / 8;
  static_assert(kUnits % 32 == 0);
  const uint32_t bytes = VO * smem::padded_row_bytes(BN);
  std::vector<int> written(bytes, 0);
  for (int warp = 0; warp < vt::kWarps; ++warp) {
    for (int step = 0; step < kUnits / 32; ++step) {
      for (int j = 0; j < 8; ++j) {
        std::set<uint32_t> banks;
        for (int lane = 0; lane < 32; ++lane) {
          const vt::Unit u = vt::unit<BN>(unsigned(32 * step + lane));
          const int word = vt::quad_word<BN>(warp, u.quad);
          const int dim = vt::store_dim<BN>(u.piece, j);
          const uint32_t off = vt::store_offset(vt::store0_offset<BN, VO>(u, word), j);
          ASSERT_EQ(off, smem::tile_offset8(dim, 4 * word, VO)) << what;
          ASSERT_EQ(off % 4, 0u) << what;
          banks.insert(off / 4 % 32);
          // The piece's dims are the 8 at 8 piece (the store order a permutation of them).
          ASSERT_EQ(dim / 8, u.piece) << what;
          for (int b = 0; b < 4; ++b) {
            const int key = warp * BN / vt::kWarps + vt::key_lane(u.quad, b);
            ASSERT_EQ(key, vt::key_of_column(4 * word + b)) << what << ": column's key";
            ASSERT_LT(vt::key_lane(u.quad, b), BN / vt::kWarps) << what << ": a lane of the warp";
            ++written.at(off + uint32_t(b));
          }
        }
        EXPECT_EQ(banks.size(), 32u) << what << " warp " << warp << " step " << step << " j " << j;
      }
    }
  }
  // Every byte of the tile's real columns once, none of the padding (BN 64 rows are padded).
  for (int dim = 0; dim < VO; ++dim) {
    for (int col = 0; col < int(smem::padded_row_bytes(BN)); ++col) {
      EXPECT_EQ(written[smem::tile_offset8(dim, col, VO)], col < BN ? 1 : 0)
          << what << " dim " << dim << " column " << col;
    }
  }
}

TEST(Fa3VTranspose, EveryByteOnceFromItsKeyAndEveryStoreConflictFree) {
  check_transpose<128, 64>();
  check_transpose<128, 128>();
  check_transpose<64, 256>();
}

}  // namespace
}  // namespace kvattn::fa3
