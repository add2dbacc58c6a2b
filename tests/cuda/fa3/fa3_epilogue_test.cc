// fa3's epilogue staging tile (src/cuda/fa3/kernels/epilogue.h): every (row, byte) of a staging
// row has its own place inside the tile, and the two shared-memory accesses of the epilogue are
// one wavefront per phase: the fragment stores (16-bit output: 4 bytes a lane; f32: 8 bytes) and
// the copy's 16-byte reads of whole rows, for every staging row width the kernels use (128, 256
// and 512 bytes). The replay checks what the epilogue writes (fa3_replay_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cuda/fa3/kernels/epilogue.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"

namespace kvattn::fa3 {
namespace {

struct Access {
  int lane;
  uint32_t addr;
};

// The most wavefronts a phase of one warp instruction of `bytes` per lane takes: shared memory
// serves 128 bytes a phase (32 lanes of 4 bytes, 16 of 8, 8 of 16), each phase in as many
// wavefronts as the most distinct 4-byte words one of the 32 banks is asked for.
int phase_wavefronts(const std::vector<Access>& lanes, int bytes) {
  const int per_phase = 128 / std::max(bytes, 4);
  std::map<int, std::map<uint32_t, std::set<uint32_t>>> banks;  // phase -> bank -> words
  for (const Access& a : lanes) {
    for (uint32_t w = a.addr / 4; w <= (a.addr + uint32_t(bytes) - 1) / 4; ++w) {
      banks[a.lane / per_phase][w % 32].insert(w);
    }
  }
  std::size_t most = 0;
  for (const auto& [phase, of_bank] : banks) {
    for (const auto& [bank, words] : of_bank) most = std::max(most, words.size());
  }
  return int(most);
}

using Offset = uint32_t (*)(int row, int byte_col, int row_bytes, int elem_bytes);
uint32_t unswizzled(int row, int byte_col, int row_bytes, int) {
  return uint32_t(row * row_bytes + byte_col);
}

// The most wavefronts a phase of the epilogue's fragment stores and row reads takes, for
// staging rows of `row_bytes` and output elements of `elem_bytes`, under the layout `offset`.
struct Worst {
  int store = 0, read = 0;
};
Worst worst_phases(Offset offset, int row_bytes, int elem_bytes) {
  Worst w;
  const int pass_cols = row_bytes / elem_bytes;
  const int store_bytes = 2 * elem_bytes;  // two adjacent columns a lane
  for (int warp = 0; warp < 4; ++warp) {
    for (int h = 0; h < 2; ++h) {
      for (int jj = 0; jj < pass_cols / 8; ++jj) {
        std::vector<Access> lanes;
        for (int lane = 0; lane < 32; ++lane) {
          const int ctid = 32 * warp + lane;
          const int row = frag::acc_element(ctid, 2 * h).row;
          lanes.push_back(
              {lane, offset(row, (8 * jj + 2 * (lane % 4)) * elem_bytes, row_bytes, elem_bytes)});
        }
        w.store = std::max(w.store, phase_wavefronts(lanes, store_bytes));
      }
    }
  }
  const int row_chunks = row_bytes / 16;
  for (int c0 = 0; c0 < 64 * row_chunks; c0 += 32) {  // the copy loop's warp instructions
    std::vector<Access> lanes;
    for (int lane = 0; lane < 32; ++lane) {
      const int c = c0 + lane;
      lanes.push_back({lane, offset(c / row_chunks, 16 * (c % row_chunks), row_bytes, elem_bytes)});
    }
    w.read = std::max(w.read, phase_wavefronts(lanes, 16));
  }
  return w;
}

TEST(Fa3Epilogue, StagingLayoutIsABijectionInsideTheTile) {
  for (int elem_bytes : {2, 4}) {
    for (int row_bytes : {128, 256, 512}) {
      std::set<uint32_t> seen;
      for (int row = 0; row < frag::kWarpgroupRows; ++row) {
        for (int b = 0; b < row_bytes; ++b) {
          const uint32_t off = epi::staged_offset(row, b, row_bytes, elem_bytes);
          ASSERT_LT(off, uint32_t(frag::kWarpgroupRows * row_bytes));
          ASSERT_TRUE(seen.insert(off).second) << row << ", " << b;
          // A 16-byte chunk stays whole (the copy reads it with one ld.shared.v4).
          ASSERT_EQ(off % 16, uint32_t(b % 16));
        }
      }
    }
  }
}

TEST(Fa3Epilogue, FragmentStoresAndRowReadsAreOneWavefrontPerPhase) {
  for (int elem_bytes : {2, 4}) {
    for (int row_bytes : {128, 256, 512}) {
      const std::string what =
          std::to_string(elem_bytes) + "-byte output, " + std::to_string(row_bytes) + "-byte rows";
      const Worst w = worst_phases(&epi::staged_offset, row_bytes, elem_bytes);
      EXPECT_EQ(w.store, 1) << what << ": fragment stores";
      EXPECT_EQ(w.read, 1) << what << ": 16-byte row reads";
      // The same accesses without the swizzle: every row of a phase on the same banks.
      const Worst plain = worst_phases(&unswizzled, row_bytes, elem_bytes);
      EXPECT_EQ(plain.store, elem_bytes == 2 ? 8 : 4) << what << ": unswizzled";
    }
  }
}

// Every pass of every kernel's staging: whole 128-byte lines, inside the warpgroup's Q tile.
TEST(Fa3Epilogue, PassesFitTheQTile) {
  using S128 = epi::Stage<128, epi::F32Out>;
  EXPECT_EQ(S128::pass_cols<256>(), 64);  // 16-bit Q d128, f32 out: two passes of 256 bytes
  EXPECT_EQ(S128::pass_cols<128>(), 32);  // FP8 Q d128, f32 out: four passes of 128 bytes
  EXPECT_EQ(S128::pass_cols<384>(), 64);  // 16-bit Q d192: 256 of the 384 bytes
  using B128 = epi::Stage<128, cuda::Bf16Tag>;
  EXPECT_EQ(B128::pass_cols<256>(), 128);  // 16-bit out from a 16-bit Q tile: one pass
  EXPECT_EQ(B128::pass_cols<512>(), 128);
  using B64 = epi::Stage<64, cuda::F16Tag>;
  EXPECT_EQ(B64::pass_cols<128>(), 64);
}

}  // namespace
}  // namespace kvattn::fa3
