// fa3's shared-memory tiles, wgmma descriptors and wgmma fragments (src/cuda/fa3/kernels/
// smem_layout.h, wgmma_fragment.h) replayed on the CPU. The producer writes Q, K and V where
// tile_offset says (what TMA's 128-byte swizzle and the paged cp.async producer write); an
// emulated wgmma reads them through the encoded descriptors with the PTX ISA's canonical layouts
// and accumulates into the m64nNk16 fragments; S = Q K^T and O = P V (P taken from S's
// accumulators as the register A operand) must equal the plain products. Also: the layout is a
// bijection, and the accesses the layout promises conflict-free hit distinct banks.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <set>
#include <vector>

#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"

namespace kvattn::fa3 {
namespace {

constexpr int kD = 128;
constexpr int kM = sched::kBlockM;
constexpr int kN = sched::kBlockN;

// Shared memory as 16-bit slots (values small integers, so every product below is exact).
struct Smem {
  std::vector<float> mem;
  explicit Smem(size_t bytes) : mem(bytes / 2, -1e30f) {}
  void store(uint32_t byte, float v) { mem.at(byte / 2) = v; }
  float load(uint32_t byte) const { return mem.at(byte / 2); }
};

TEST(Fa3SmemLayout, TileOffsetIsABijectionAndSwizzleStaysInItsAtom) {
  for (int rows : {64, 128}) {
    std::set<uint32_t> seen;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < kD; ++c) {
        const uint32_t off = smem::tile_offset(r, c, rows);
        ASSERT_LT(off, smem::tile_bytes(rows, kD));
        ASSERT_EQ(off % 2, 0u);
        ASSERT_TRUE(seen.insert(off).second) << "row " << r << " col " << c;
      }
    }
  }
  for (uint32_t b = 0; b < 4096; ++b) {
    EXPECT_EQ(smem::swizzle128(b) / smem::kAtomBytes, b / smem::kAtomBytes);
    EXPECT_EQ(smem::swizzle128(smem::swizzle128(b)), b);
  }
}

TEST(Fa3SmemLayout, TmaBoxesLandWhereTheTileLayoutSays) {
  // A TMA box with the 128-byte swizzle: 64 columns x rows, row r at 128 r, swizzled from its
  // 1024-byte aligned destination.
  for (int rows : {64, 128}) {
    for (int panel = 0; panel < kD / smem::kPanelCols16; ++panel) {
      const uint32_t dst = smem::tma_panel_offset(panel, rows);
      ASSERT_EQ(dst % smem::kAtomBytes, 0u);
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < smem::kPanelCols16; ++c) {
          ASSERT_EQ(dst + smem::swizzle128(uint32_t(r) * 128u + uint32_t(c) * 2u),
                    smem::tile_offset(r, panel * smem::kPanelCols16 + c, rows));
        }
      }
    }
  }
}

TEST(Fa3SmemLayout, DescriptorEncodingRoundTrips) {
  for (uint32_t start : {0u, 1024u, 65536u, 200704u}) {
    const smem::Desc d = smem::mn_major(start, kN, 3);
    const smem::Desc back = smem::decode(smem::encode(d));
    EXPECT_EQ(back.start, d.start);
    EXPECT_EQ(back.lbo, d.lbo);
    EXPECT_EQ(back.sbo, d.sbo);
    EXPECT_EQ(smem::encode(d) >> 62, smem::kLayout128B);
  }
}

// wgmma m64nNk16 with A and B from shared memory (both K-major), one k-step, accumulating into
// the warpgroup's registers acc[tid][i].
void wgmma_ss_kmajor(const Smem& s, uint64_t a_desc, uint64_t b_desc, int n,
                     std::vector<std::vector<float>>& acc) {
  const smem::Desc a = smem::decode(a_desc), b = smem::decode(b_desc);
  for (int tid = 0; tid < frag::kWarpgroupThreads; ++tid) {
    for (int i = 0; i < n / 2; ++i) {
      const frag::RowCol rc = frag::acc_element(tid, i);
      double sum = 0;
      for (int k = 0; k < 16; ++k) {
        sum += double(s.load(smem::k_major_address(a, rc.row, k))) *
               s.load(smem::k_major_address(b, rc.col, k));
      }
      acc[tid][i] += float(sum);
    }
  }
}

// wgmma m64nNk16 with A from registers (a[tid][r][h]) and B from shared memory, MN-major.
void wgmma_rs_mnmajor(const Smem& s, const std::vector<std::array<std::array<float, 2>, 4>>& a,
                      uint64_t b_desc, int n, std::vector<std::vector<float>>& acc) {
  float A[64][16];
  for (int tid = 0; tid < frag::kWarpgroupThreads; ++tid) {
    for (int r = 0; r < 4; ++r) {
      for (int h = 0; h < 2; ++h) {
        const frag::RowCol rc = frag::a_element(tid, r, h);
        A[rc.row][rc.col] = a[tid][r][h];
      }
    }
  }
  const smem::Desc b = smem::decode(b_desc);
  for (int tid = 0; tid < frag::kWarpgroupThreads; ++tid) {
    for (int i = 0; i < n / 2; ++i) {
      const frag::RowCol rc = frag::acc_element(tid, i);
      double sum = 0;
      for (int k = 0; k < 16; ++k) {
        sum += double(A[rc.row][k]) * s.load(smem::mn_major_address(b, rc.col, k));
      }
      acc[tid][i] += float(sum);
    }
  }
}

// The kernel's descriptors are made once per operand and advanced per k-step (smem::advance,
// consumer_steps.h): the same bits as the descriptor built for the k-step, for every operand the
// kernel reads (K-major Q / K rows of 64-256 at first rows 0 and 128, FP8 V^T as K-major, MN-major
// 16-bit V of 64 or 128 keys), every k-step, at every 16-byte aligned start address of a tile that
// lies in an SM's shared memory (228 KB).
TEST(Fa3SmemLayout, AdvancedDescriptorsEqualRebuiltOnes) {
  constexpr uint32_t kSmemEnd = 228 * 1024;
  int64_t checked = 0;
  for (uint32_t base = 0; base < kSmemEnd; base += 16) {
    for (int rows : {64, 128, 256}) {
      for (int first_row : {0, 128}) {
        if (first_row >= rows) continue;
        const uint64_t d0 = smem::encode(smem::k_major(base, rows, first_row, 0));
        for (int ks = 0; ks < 16; ++ks) {
          const smem::Desc d = smem::k_major(base, rows, first_row, ks);
          if (d.start >= kSmemEnd) break;
          ASSERT_EQ(smem::advance(d0, smem::k_major_step(rows, ks)), smem::encode(d))
              << "k-major rows " << rows << " first row " << first_row << " k-step " << ks
              << " base " << base;
          ++checked;
        }
      }
    }
    for (int keys : {64, 128}) {
      const uint64_t d0 = smem::encode(smem::mn_major(base, keys, 0));
      for (int kk = 0; kk < keys / 16; ++kk) {
        const smem::Desc d = smem::mn_major(base, keys, kk);
        if (d.start >= kSmemEnd) break;
        ASSERT_EQ(smem::advance(d0, smem::mn_major_step(keys, kk)), smem::encode(d))
            << "mn-major keys " << keys << " k-step " << kk << " base " << base;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 900000);
}

// One pair of head dims' S = Q K^T and O = P V through the producer's tiles and the kernel's
// descriptors (N of the PV GEMM = the V head dim).
void check_16bit_wgmma(int qk, int vo) {
  const int bn = tile_shape(qk, vo, 2).block_n;  // keys per block, as the kernel uses
  std::mt19937 rng(5);
  auto val = [&] { return float(int(rng() % 7) - 3); };
  std::vector<float> q(kM * qk), k(bn * qk), v(bn * vo);
  for (float& x : q) x = val();
  for (float& x : k) x = val();
  for (float& x : v) x = val();
  // Layout of the CTA's shared memory, every tile 1024-byte aligned.
  const uint32_t q_base = 0, k_base = smem::tile_bytes(kM, qk),
                 v_base = k_base + smem::tile_bytes(bn, qk);
  ASSERT_EQ(k_base % smem::kAtomBytes, 0u);
  Smem s(v_base + smem::tile_bytes(bn, vo));
  for (int r = 0; r < kM; ++r)
    for (int c = 0; c < qk; ++c) s.store(q_base + smem::tile_offset(r, c, kM), q[r * qk + c]);
  for (int r = 0; r < bn; ++r) {
    for (int c = 0; c < qk; ++c) s.store(k_base + smem::tile_offset(r, c, bn), k[r * qk + c]);
    for (int c = 0; c < vo; ++c) s.store(v_base + smem::tile_offset(r, c, bn), v[r * vo + c]);
  }
  for (int wg = 0; wg < kM / frag::kWarpgroupRows; ++wg) {
    // S = Q K^T for this warpgroup's 64 rows: N = bn keys, D / 16 k-steps.
    std::vector<std::vector<float>> sacc(128, std::vector<float>(bn / 2, 0.0f));
    for (int ks = 0; ks < qk / 16; ++ks) {
      wgmma_ss_kmajor(s, smem::encode(smem::k_major(q_base, kM, wg * frag::kWarpgroupRows, ks)),
                      smem::encode(smem::k_major(k_base, bn, 0, ks)), bn, sacc);
    }
    std::vector<double> sref(64 * bn, 0.0);  // the plain product for this warpgroup's rows
    for (int r = 0; r < 64; ++r)
      for (int j = 0; j < bn; ++j)
        for (int d = 0; d < qk; ++d)
          sref[r * bn + j] += double(q[(wg * 64 + r) * qk + d]) * k[j * qk + d];
    for (int tid = 0; tid < 128; ++tid) {
      for (int i = 0; i < bn / 2; ++i) {
        const frag::RowCol rc = frag::acc_element(tid, i);
        ASSERT_EQ(sacc[tid][i], float(sref[rc.row * bn + rc.col]))
            << "S wg " << wg << " tid " << tid << " reg " << i;
      }
    }
    // O = P V with P = S (the accumulators reused as A registers): N = vo, bn / 16 k-steps.
    std::vector<std::vector<float>> oacc(128, std::vector<float>(vo / 2, 0.0f));
    for (int kk = 0; kk < bn / 16; ++kk) {
      std::vector<std::array<std::array<float, 2>, 4>> a(128);
      for (int tid = 0; tid < 128; ++tid)
        for (int r = 0; r < 4; ++r)
          for (int h = 0; h < 2; ++h) a[tid][r][h] = sacc[tid][frag::p_a_register(kk, r, h)];
      wgmma_rs_mnmajor(s, a, smem::encode(smem::mn_major(v_base, bn, kk)), vo, oacc);
    }
    for (int tid = 0; tid < 128; ++tid) {
      for (int i = 0; i < vo / 2; ++i) {
        const frag::RowCol rc = frag::acc_element(tid, i);
        double want = 0;
        for (int j = 0; j < bn; ++j) want += sref[rc.row * bn + j] * v[j * vo + rc.col];
        ASSERT_EQ(oacc[tid][i], float(want)) << "O wg " << wg << " tid " << tid << " reg " << i;
      }
    }
  }
}

TEST(Fa3SmemLayout, EmulatedWgmmaOverProducerTilesGivesQKtAndPV) {
  check_16bit_wgmma(128, 128);
  check_16bit_wgmma(64, 64);
  check_16bit_wgmma(192, 128);
  check_16bit_wgmma(256, 256);
}

// The FP8 (k32) path: Q, K and V^T as 8-bit tiles (one slot per byte), S = Q K^T through the
// same descriptors with 32-byte k-steps, P from S's accumulators into the 8-bit A fragment, and
// V^T's columns renumbered as wgmma_fragment.h says: O must be exactly P V.
// The FP8 tiles of head dims qk / vo over blocks of bn keys, as the FP8 producer writes them: Q
// and K rows of qk bytes and V^T rows of bn keys, each padded to whole 128-byte panels
// (smem::padded_row_bytes; the kernel's SmemPlan sizes them so), the padding left unwritten (a
// wgmma that read it would see -1e30). k32 steps read only the real bytes.
void emulated_fp8_wgmma(int qk, int vo, int bn) {
  const int kD = qk, kN = bn;
  std::mt19937 rng(9);
  auto val = [&] { return float(int(rng() % 5) - 2); };
  std::vector<float> q(kM * kD), k(kN * kD), v(kN * vo);
  for (float& x : q) x = val();
  for (float& x : k) x = val();
  for (float& x : v) x = val();
  const uint32_t q_base = 0, k_base = kM * smem::padded_row_bytes(kD),
                 vt_base = k_base + kN * smem::padded_row_bytes(kD);
  std::vector<float> mem(vt_base + vo * smem::padded_row_bytes(kN), -1e30f);  // one per byte
  for (int r = 0; r < kM; ++r)
    for (int c = 0; c < kD; ++c) mem[q_base + smem::tile_offset8(r, c, kM)] = q[r * kD + c];
  for (int j = 0; j < kN; ++j) {
    for (int c = 0; c < kD; ++c) mem[k_base + smem::tile_offset8(j, c, kN)] = k[j * kD + c];
    // V^T: row = dim, column = the k-step column that stands for key j.
    const int col = (j / 32) * 32 + frag::fp8_column_of_key(j % 32);
    for (int c = 0; c < vo; ++c) mem[vt_base + smem::tile_offset8(c, col, vo)] = v[j * vo + c];
  }
  for (int c = 0; c < 32; ++c) {
    ASSERT_EQ(frag::fp8_column_of_key(frag::fp8_key_of_column(c)), c);
  }
  for (int wg = 0; wg < 2; ++wg) {
    std::vector<std::vector<float>> sacc(128, std::vector<float>(kN / 2, 0.0f));
    for (int ks = 0; ks < kD / 32; ++ks) {
      const smem::Desc a = smem::decode(smem::encode(smem::k_major(q_base, kM, wg * 64, ks)));
      const smem::Desc b = smem::decode(smem::encode(smem::k_major(k_base, kN, 0, ks)));
      for (int tid = 0; tid < 128; ++tid) {
        for (int i = 0; i < kN / 2; ++i) {
          const frag::RowCol rc = frag::acc_element(tid, i);
          double sum = 0;
          for (int kq = 0; kq < 32; ++kq) {
            sum += double(mem[smem::k_major_address(a, rc.row, kq, 1)]) *
                   mem[smem::k_major_address(b, rc.col, kq, 1)];
          }
          sacc[tid][i] += float(sum);
        }
      }
    }
    std::vector<double> sref(64 * kN, 0.0);
    for (int r = 0; r < 64; ++r)
      for (int j = 0; j < kN; ++j)
        for (int d = 0; d < kD; ++d)
          sref[r * kN + j] += double(q[(wg * 64 + r) * kD + d]) * k[j * kD + d];
    for (int tid = 0; tid < 128; ++tid) {
      for (int i = 0; i < kN / 2; ++i) {
        const frag::RowCol rc = frag::acc_element(tid, i);
        ASSERT_EQ(sacc[tid][i], float(sref[rc.row * kN + rc.col]))
            << "S tid " << tid << " head dims (" << qk << ", " << vo << ")";
      }
    }
    // O = P V: k32 steps over keys, A (P) from registers, B = V^T K-major.
    std::vector<std::vector<float>> oacc(128, std::vector<float>(vo / 2, 0.0f));
    for (int kk = 0; kk < kN / 32; ++kk) {
      float A[64][32];
      for (int tid = 0; tid < 128; ++tid) {
        for (int r = 0; r < 4; ++r) {
          for (int b = 0; b < 4; ++b) {
            const frag::RowCol rc = frag::a_element8(tid, r, b);
            A[rc.row][rc.col] = sacc[tid][frag::p_a_register8(kk, r, b)];
          }
        }
      }
      const smem::Desc bd = smem::decode(smem::encode(smem::k_major(vt_base, vo, 0, kk)));
      for (int tid = 0; tid < 128; ++tid) {
        for (int i = 0; i < vo / 2; ++i) {
          const frag::RowCol rc = frag::acc_element(tid, i);
          double sum = 0;
          for (int c = 0; c < 32; ++c) {
            sum += double(A[rc.row][c]) * mem[smem::k_major_address(bd, rc.col, c, 1)];
          }
          oacc[tid][i] += float(sum);
        }
      }
    }
    for (int tid = 0; tid < 128; ++tid) {
      for (int i = 0; i < vo / 2; ++i) {
        const frag::RowCol rc = frag::acc_element(tid, i);
        double want = 0;
        for (int j = 0; j < kN; ++j) want += sref[rc.row * kN + j] * v[j * vo + rc.col];
        ASSERT_EQ(oacc[tid][i], float(want)) << "O wg " << wg << " tid " << tid << " reg " << i
                                             << " head dims (" << qk << ", " << vo << ")";
      }
    }
  }
}

TEST(Fa3SmemLayout, EmulatedFp8WgmmaWithRenumberedKeysGivesQKtAndPV) {
  // fa3's FP8 kernels: every declared head dims, with the kernel's block size for each.
  for (auto [qk, vo] :
       {std::pair{128, 128}, std::pair{64, 64}, std::pair{192, 128}, std::pair{256, 256}}) {
    emulated_fp8_wgmma(qk, vo, tile_shape(qk, vo, 1).block_n);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The padding is real: Q/K rows of 64 and 192 bytes and V^T rows of 64 keys take whole panels.
  EXPECT_EQ(smem::padded_row_bytes(64), 128u);
  EXPECT_EQ(smem::padded_row_bytes(192), 256u);
  EXPECT_EQ(smem::padded_row_bytes(256), 256u);
}

TEST(Fa3WgmmaFragment, AccumulatorAndAOperandMapsAreBijections) {
  for (int n : {64, 128, 256}) {
    std::set<std::pair<int, int>> seen;
    for (int tid = 0; tid < 128; ++tid) {
      for (int i = 0; i < n / 2; ++i) {
        const frag::RowCol rc = frag::acc_element(tid, i);
        ASSERT_LT(rc.row, 64);
        ASSERT_LT(rc.col, n);
        ASSERT_TRUE(seen.insert({rc.row, rc.col}).second);
        ASSERT_EQ(rc.row % 16 % 8 + 8 * frag::acc_row_half(i), rc.row % 16);
      }
    }
    EXPECT_EQ(int(seen.size()), 64 * n);
  }
  std::set<std::pair<int, int>> a_seen;
  for (int tid = 0; tid < 128; ++tid)
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) {
        const frag::RowCol rc = frag::a_element(tid, r, h);
        ASSERT_TRUE(a_seen.insert({rc.row, rc.col}).second);
      }
  EXPECT_EQ(a_seen.size(), 64u * 16u);
  std::set<std::pair<int, int>> a8_seen;
  for (int tid = 0; tid < 128; ++tid)
    for (int r = 0; r < 4; ++r)
      for (int b = 0; b < 4; ++b) {
        const frag::RowCol rc = frag::a_element8(tid, r, b);
        ASSERT_TRUE(a8_seen.insert({rc.row, rc.col}).second);
        // The accumulator it comes from holds the same row, and the key its column stands for.
        const frag::RowCol from = frag::acc_element(tid, frag::p_a_register8(1, r, b));
        ASSERT_EQ(from.row, rc.row);
        ASSERT_EQ(from.col, 32 + frag::fp8_key_of_column(rc.col));
      }
  EXPECT_EQ(a8_seen.size(), 64u * 32u);
}

// 16-byte shared stores and loads are served 8 threads (128 bytes) per phase; a phase is free of
// bank conflicts when its 8 chunks fall in 8 distinct 16-byte bank groups.
bool phase_conflict_free(const std::vector<uint32_t>& byte_addresses) {
  std::set<uint32_t> groups;
  for (uint32_t a : byte_addresses) groups.insert((a / 16) % 8);
  return groups.size() == byte_addresses.size();
}

TEST(Fa3SmemLayout, PagedCpAsyncProducerStoresAreConflictFree) {
  constexpr int kProducerThreads = 128;  // the producer warpgroup copies pages with cp.async
  const int chunks = kN * kD / 8;
  for (int step = 0; step * kProducerThreads < chunks; ++step) {
    for (int warp = 0; warp < kProducerThreads / 32; ++warp) {
      for (int phase = 0; phase < 4; ++phase) {
        std::vector<uint32_t> addrs;
        for (int l = 0; l < 8; ++l) {
          const int t = warp * 32 + phase * 8 + l;
          const smem::Chunk c = smem::copy_chunk(step * kProducerThreads + t, kD);
          addrs.push_back(smem::tile_offset(c.row, c.col, kN));
        }
        ASSERT_TRUE(phase_conflict_free(addrs)) << "step " << step << " warp " << warp;
      }
    }
  }
}

TEST(Fa3SmemLayout, EightRowsAtOneColumnChunkAreConflictFree) {
  // What a row-wise 16-byte access (stmatrix / ldmatrix phases of the epilogue) touches.
  for (int rows : {64, 128}) {
    for (int r0 = 0; r0 < rows; r0 += 8) {
      for (int c = 0; c < kD; c += 8) {
        std::vector<uint32_t> addrs;
        for (int r = r0; r < r0 + 8; ++r) addrs.push_back(smem::tile_offset(r, c, rows));
        ASSERT_TRUE(phase_conflict_free(addrs)) << "rows " << r0 << " col " << c;
      }
    }
  }
  // Without the swizzle the same accesses would all hit one bank group: the test can fail.
  std::vector<uint32_t> plain;
  for (int r = 0; r < 8; ++r) plain.push_back(uint32_t(r) * smem::kRowBytes);
  EXPECT_FALSE(phase_conflict_free(plain));
}

}  // namespace
}  // namespace kvattn::fa3
