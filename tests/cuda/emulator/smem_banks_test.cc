// The bank-conflict model of tests/cuda/emulator/smem_banks.h on accesses whose wavefronts are
// known: linear words, one bank, broadcast, 16-byte rows and the 128-byte swizzle.
#include "cuda/emulator/smem_banks.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvattn::fa3::emu {
namespace {

std::vector<LaneAccess> warp(int bytes, uint32_t (*addr)(int lane)) {
  std::vector<LaneAccess> v;
  for (int lane = 0; lane < 32; ++lane) v.push_back(LaneAccess{lane, addr(lane), bytes});
  return v;
}

TEST(SmemBanks, WavefrontsOfKnownAccesses) {
  // 32 consecutive words: one wavefront.
  EXPECT_EQ(wavefronts(warp(4, [](int l) { return uint32_t(4 * l); })), 1);
  // Every lane in bank 0, a different word each (a column of 128-byte rows): 32.
  EXPECT_EQ(wavefronts(warp(4, [](int l) { return uint32_t(128 * l); })), 32);
  // Every lane the same word: one (broadcast / merged).
  EXPECT_EQ(wavefronts(warp(4, [](int) { return 64u; })), 1);
  // Bytes of 8 rows 16 apart at one column (the byte-by-byte V transpose's pattern): 8.
  EXPECT_EQ(wavefronts(warp(1, [](int l) { return uint32_t(128 * 16 * (l % 8) + l / 8); })), 8);
  // 16-byte stores of consecutive chunks: 4 quarter-warp phases, each one wavefront.
  const auto linear16 = warp(16, [](int l) { return uint32_t(16 * l); });
  EXPECT_EQ(wavefronts(linear16), 4);
  EXPECT_EQ(min_wavefronts(linear16), 4);
  // 16-byte stores down a column of 128-byte rows: 8 lanes a phase in 4 banks, 8 words each.
  EXPECT_EQ(wavefronts(warp(16, [](int l) { return uint32_t(128 * l); })), 4 * 8);
  // ... and with the 128-byte swizzle (chunk XOR row mod 8) the column is conflict-free.
  EXPECT_EQ(wavefronts(warp(16, [](int l) { return uint32_t(128 * l + 16 * (l % 8)); })), 4);
  // 8-byte stores: two half-warp phases.
  EXPECT_EQ(wavefronts(warp(8, [](int l) { return uint32_t(8 * l); })), 2);
}

TEST(SmemBanks, CounterGroupsTheLanesOfAWarpInstruction) {
  WarpAccessCounter c(64, 2);
  // Warp 0: two instructions, conflict-free then 32-way; warp 1: one, kind 1, lanes disagreeing.
  for (int lane = 0; lane < 32; ++lane) {
    c.record(lane, 0, uint32_t(4 * lane), 4);
    c.record(lane, 0, uint32_t(128 * lane), 4);
    c.record(32 + lane, 1, uint32_t(4 * lane), lane == 5 ? 8 : 4);
  }
  c.flush();
  EXPECT_EQ(c.stats(0).instructions, 2);
  EXPECT_EQ(c.stats(0).wavefronts, 1 + 32);
  EXPECT_EQ(c.stats(0).min_wavefronts, 2);
  EXPECT_EQ(c.stats(0).divergent, 0);
  EXPECT_EQ(c.stats(1).instructions, 0);
  EXPECT_EQ(c.stats(1).divergent, 1);
}

}  // namespace
}  // namespace kvattn::fa3::emu
