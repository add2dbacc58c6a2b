// fa2's warp-level index math (src/cuda/fa2/kernels/fragment_layout.h) and online softmax
// (kernels/online_softmax.h) replayed on the CPU: the whole-warp emulations of ldmatrix (plain
// and .trans) and mma.m16n8k16 (warp_emulation.h, the PTX ISA's fragment layouts) run the kernel's
// exact sequence for S = Q K^T and O += P V over swizzled tiles, and the result must equal the
// plain matrix products; then a warp attends over several K/V blocks with masked keys and rows, and
// must match a plain softmax. Also: the swizzle is a bijection inside each row and every ldmatrix
// phase touches 8 distinct 16-byte bank groups.
#include "cuda/fa2/kernels/fragment_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "core/attention_math.h"
#include "cuda/fa2/kernels/online_softmax.h"
#include "cuda/fa2/params.h"
#include "cuda/emulator/warp_emulation.h"

namespace kvattn::fa2 {
namespace {

using Warp = emu::WarpRegs<float, 4>;  // four b32 registers of two 16-bit halves, per lane
using WarpB = emu::WarpRegs<float, 2>;
using Acc = emu::WarpAcc;  // one m16n8 f32 tile, per lane

// ldmatrix.x4 over `mem`, lane l giving the row that starts at mem[lane_addr[l]].
Warp ldmatrix_x4(const std::vector<float>& mem, const std::array<int, 32>& lane_addr, bool trans) {
  std::array<const float*, 32> rows;
  for (int lane = 0; lane < 32; ++lane) rows[size_t(lane)] = mem.data() + lane_addr[size_t(lane)];
  return emu::ldmatrix_x4(rows, trans);
}

void mma(Acc& d, const Warp& a, const WarpB& b) {
  emu::mma_m16n8k16(d, a, b, [](float x) { return x; });
}

WarpB pick_b(const Warp& w, int first) {
  WarpB b{};
  for (int lane = 0; lane < 32; ++lane) {
    b[lane][0] = w[lane][first];
    b[lane][1] = w[lane][first + 1];
  }
  return b;
}

// A [rows x D] logical matrix stored swizzled.
// `row` is the shared-memory row width (params.h smem_row: d padded to a multiple of 64).
std::vector<float> store_swizzled(const std::vector<float>& m, int rows, int d, int row = 0) {
  if (row == 0) row = d;
  std::vector<float> mem(size_t(rows * row), NAN);  // the pad is never read
  std::set<int> seen;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < d; ++c) {
      const int off = frag::swizzled(r, c, row);
      EXPECT_GE(off, r * row);
      EXPECT_LT(off, (r + 1) * row);
      EXPECT_TRUE(seen.insert(off).second) << "swizzle collides at " << r << "," << c;
      mem[size_t(off)] = m[size_t(r * d + c)];
    }
  }
  return mem;
}

// Every 8-lane phase of an ldmatrix reads 8 rows of 16 bytes; bank group = (byte / 16) % 8.
void expect_conflict_free(const std::array<int, 32>& addr) {
  for (int phase = 0; phase < 4; ++phase) {
    std::set<int> groups;
    for (int r = 0; r < 8; ++r) groups.insert((addr[8 * phase + r] * 2 / 16) % 8);
    EXPECT_EQ(groups.size(), 8u) << "phase " << phase;
  }
}

void check_warp_tile(int dqk, int dvo, int keys, int warp) {
  std::mt19937 rng(uint32_t(dqk * 1000 + keys + warp));
  std::uniform_int_distribution<int> small(-4, 4);  // exact in any precision
  const int rows = 16 * (warp + 1);
  std::vector<float> q(size_t(rows * dqk)), k(size_t(keys * dqk)), v(size_t(keys * dvo));
  for (float& x : q) x = float(small(rng));
  for (float& x : k) x = float(small(rng));
  for (float& x : v) x = float(small(rng));
  const std::vector<float> q_mem = store_swizzled(q, rows, dqk, smem_row(dqk));
  const std::vector<float> k_mem = store_swizzled(k, keys, dqk, smem_row(dqk));
  const std::vector<float> v_mem = store_swizzled(v, keys, dvo, smem_row(dvo));

  // S = Q K^T, as attend_block computes it.
  const int ntiles = keys / 8;
  std::vector<Acc> s(size_t(ntiles), Acc{});
  for (int ks = 0; ks < dqk / 16; ++ks) {
    std::array<int, 32> qa;
    for (int lane = 0; lane < 32; ++lane) {
      frag::RowCol rc = frag::q_ldmatrix(warp, lane, ks);
      qa[size_t(lane)] = frag::swizzled(rc.row, rc.col, smem_row(dqk));
    }
    expect_conflict_free(qa);
    const Warp a = ldmatrix_x4(q_mem, qa, false);
    for (int nt2 = 0; nt2 < ntiles / 2; ++nt2) {
      std::array<int, 32> ka;
      for (int lane = 0; lane < 32; ++lane) {
        frag::RowCol rc = frag::k_ldmatrix(lane, nt2, ks);
        ka[size_t(lane)] = frag::swizzled(rc.row, rc.col, smem_row(dqk));
      }
      expect_conflict_free(ka);
      const Warp b = ldmatrix_x4(k_mem, ka, false);
      mma(s[size_t(2 * nt2)], a, pick_b(b, 0));
      mma(s[size_t(2 * nt2 + 1)], a, pick_b(b, 2));
    }
  }
  for (int nt = 0; nt < ntiles; ++nt) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int e = 0; e < 4; ++e) {
        const frag::RowCol rc = frag::acc_element(lane, e);
        const int row = warp * 16 + rc.row, key = nt * 8 + rc.col;
        double want = 0;
        for (int d = 0; d < dqk; ++d)
          want += double(q[size_t(row * dqk + d)]) * k[size_t(key * dqk + d)];
        ASSERT_EQ(s[size_t(nt)][size_t(lane)][size_t(e)], float(want))
            << "S row " << row << " key " << key << " lane " << lane << " e " << e;
      }
    }
  }

  // O = P V with P taken from the S accumulators exactly as the kernel packs them.
  std::vector<Acc> o(size_t(dvo / 8), Acc{});
  for (int kk = 0; kk < keys / 16; ++kk) {
    Warp a{};
    for (int lane = 0; lane < 32; ++lane) {
      const Acc& lo = s[size_t(2 * kk)];
      const Acc& hi = s[size_t(2 * kk + 1)];
      a[lane][0] = {lo[lane][0], lo[lane][1]};
      a[lane][1] = {lo[lane][2], lo[lane][3]};
      a[lane][2] = {hi[lane][0], hi[lane][1]};
      a[lane][3] = {hi[lane][2], hi[lane][3]};
    }
    for (int dt2 = 0; dt2 < dvo / 16; ++dt2) {
      std::array<int, 32> va;
      for (int lane = 0; lane < 32; ++lane) {
        frag::RowCol rc = frag::v_ldmatrix_trans(lane, kk, dt2);
        va[size_t(lane)] = frag::swizzled(rc.row, rc.col, smem_row(dvo));
      }
      expect_conflict_free(va);
      const Warp b = ldmatrix_x4(v_mem, va, true);
      mma(o[size_t(2 * dt2)], a, pick_b(b, 0));
      mma(o[size_t(2 * dt2 + 1)], a, pick_b(b, 2));
    }
  }
  for (int dt = 0; dt < dvo / 8; ++dt) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int e = 0; e < 4; ++e) {
        const frag::RowCol rc = frag::acc_element(lane, e);
        const int row = warp * 16 + rc.row, dim = dt * 8 + rc.col;
        double want = 0;
        for (int key = 0; key < keys; ++key) {
          double p = 0;
          for (int d = 0; d < dqk; ++d)
            p += double(q[size_t(row * dqk + d)]) * k[size_t(key * dqk + d)];
          want += p * v[size_t(key * dvo + dim)];
        }
        ASSERT_EQ(o[size_t(dt)][size_t(lane)][size_t(e)], float(want))
            << "O row " << row << " dim " << dim << " lane " << lane << " e " << e;
      }
    }
  }
}

TEST(Fa2FragmentLayoutTest, WarpTilesComputeQKAndPVForEveryHeadDim) {
  struct Dims {
    int qk, vo;
  };
  // 96 reads 96 of its 128-wide padded rows (issue 11); 512 takes 16-key blocks.
  for (Dims d : {Dims{64, 64}, Dims{128, 128}, Dims{256, 256}, Dims{192, 128}, Dims{96, 96},
                 Dims{512, 512}}) {
    const int keys = kv_block_keys(d.qk);
    for (int warp : {0, 3}) check_warp_tile(d.qk, d.vo, keys, warp);
  }
}

// One warp (16 query rows) over `blocks` K/V blocks of `keys` keys, as attend_block and
// store_rows do it: S by ldmatrix + mma, masks as -inf, the online softmax per lane with the
// quad reductions done across the emulated lanes, P V, and the row finish.
void check_warp_attention(int blocks, uint32_t seed) {
  constexpr int kD = 64, kKeys = 64, kNTiles = kKeys / 8, kDTiles = kD / 8;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int total = blocks * kKeys;
  std::vector<float> q(16 * kD), k(size_t(total * kD)), v(size_t(total * kD));
  for (float& x : q) x = u(rng);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  // visible[row][key]: row 5 sees nothing, row 9 only the last key, others at random; whole
  // blocks are masked for some rows.
  std::vector<std::vector<bool>> visible(16, std::vector<bool>(size_t(total)));
  for (int r = 0; r < 16; ++r) {
    for (int j = 0; j < total; ++j) {
      bool vis = rng() % 4 != 0;
      if (r == 5) vis = false;
      if (r == 9) vis = j == total - 1;
      if (r == 12 && j < kKeys) vis = false;
      visible[size_t(r)][size_t(j)] = vis;
    }
  }
  const float kScale = 0.125f * 1.4426950408889634f;  // sm_scale * log2 e

  float o[32][kDTiles][4] = {};
  std::array<std::array<float, 2>, 32> m, l;
  for (auto& x : m) x = {-INFINITY, -INFINITY};
  for (auto& x : l) x = {0.0f, 0.0f};
  const std::vector<float> q_mem = store_swizzled(q, 16, kD);
  for (int blk = 0; blk < blocks; ++blk) {
    std::vector<float> kb(k.begin() + blk * kKeys * kD, k.begin() + (blk + 1) * kKeys * kD);
    std::vector<float> vb(v.begin() + blk * kKeys * kD, v.begin() + (blk + 1) * kKeys * kD);
    const std::vector<float> k_mem = store_swizzled(kb, kKeys, kD);
    const std::vector<float> v_mem = store_swizzled(vb, kKeys, kD);
    std::vector<Acc> sacc(kNTiles, Acc{});
    for (int ks = 0; ks < kD / 16; ++ks) {
      std::array<int, 32> qa;
      for (int lane = 0; lane < 32; ++lane) {
        frag::RowCol rc = frag::q_ldmatrix(0, lane, ks);
        qa[size_t(lane)] = frag::swizzled(rc.row, rc.col, kD);
      }
      const Warp a = ldmatrix_x4(q_mem, qa, false);
      for (int nt2 = 0; nt2 < kNTiles / 2; ++nt2) {
        std::array<int, 32> ka;
        for (int lane = 0; lane < 32; ++lane) {
          frag::RowCol rc = frag::k_ldmatrix(lane, nt2, ks);
          ka[size_t(lane)] = frag::swizzled(rc.row, rc.col, kD);
        }
        const Warp b = ldmatrix_x4(k_mem, ka, false);
        mma(sacc[size_t(2 * nt2)], a, pick_b(b, 0));
        mma(sacc[size_t(2 * nt2 + 1)], a, pick_b(b, 2));
      }
    }
    // Per lane registers, masked and scaled as attend_block does.
    std::array<float[kNTiles][4], 32> s;
    for (int lane = 0; lane < 32; ++lane) {
      for (int nt = 0; nt < kNTiles; ++nt) {
        for (int e = 0; e < 4; ++e) {
          const frag::RowCol rc = frag::acc_element(lane, e);
          const int j = blk * kKeys + nt * 8 + rc.col;
          s[size_t(lane)][nt][e] = visible[size_t(rc.row)][size_t(j)]
                                       ? sacc[size_t(nt)][size_t(lane)][size_t(e)] * kScale
                                       : -INFINITY;
        }
      }
    }
    for (int half = 0; half < 2; ++half) {
      float lane_max[32];
      for (int lane = 0; lane < 32; ++lane) lane_max[lane] = lane_block_max(s[size_t(lane)], half);
      for (int lane = 0; lane < 32; ++lane) {
        const int q0 = lane & ~3;
        const float quad_max = std::max(std::max(lane_max[q0], lane_max[q0 + 1]),
                                        std::max(lane_max[q0 + 2], lane_max[q0 + 3]));
        softmax_block_update(s[size_t(lane)], o[lane], m[size_t(lane)][size_t(half)],
                             l[size_t(lane)][size_t(half)], half, quad_max);
      }
    }
    // O += P V with P packed from the registers as the kernel does.
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      Warp a{};
      for (int lane = 0; lane < 32; ++lane) {
        const auto& sl = s[size_t(lane)];
        a[lane][0] = {sl[2 * kk][0], sl[2 * kk][1]};
        a[lane][1] = {sl[2 * kk][2], sl[2 * kk][3]};
        a[lane][2] = {sl[2 * kk + 1][0], sl[2 * kk + 1][1]};
        a[lane][3] = {sl[2 * kk + 1][2], sl[2 * kk + 1][3]};
      }
      for (int dt2 = 0; dt2 < kD / 16; ++dt2) {
        std::array<int, 32> va;
        for (int lane = 0; lane < 32; ++lane) {
          frag::RowCol rc = frag::v_ldmatrix_trans(lane, kk, dt2);
          va[size_t(lane)] = frag::swizzled(rc.row, rc.col, kD);
        }
        const Warp b = ldmatrix_x4(v_mem, va, true);
        for (int which = 0; which < 2; ++which) {
          Acc d{};
          for (int lane = 0; lane < 32; ++lane) {
            for (int e = 0; e < 4; ++e) d[size_t(lane)][size_t(e)] = o[lane][2 * dt2 + which][e];
          }
          mma(d, a, pick_b(b, 2 * which));
          for (int lane = 0; lane < 32; ++lane) {
            for (int e = 0; e < 4; ++e) o[lane][2 * dt2 + which][e] = d[size_t(lane)][size_t(e)];
          }
        }
      }
    }
  }
  // Row finish and comparison with a plain softmax in double.
  for (int lane = 0; lane < 32; ++lane) {
    for (int half = 0; half < 2; ++half) {
      const int q0 = lane & ~3;
      float quad_sum = 0;
      for (int t = 0; t < 4; ++t) quad_sum += l[size_t(q0 + t)][size_t(half)];
      const RowFinish fin = finish_row(m[size_t(lane)][size_t(half)], quad_sum, 2.0f);
      const int row = frag::acc_element(lane, 2 * half).row;
      std::vector<double> sc(static_cast<size_t>(total));
      double mx = -INFINITY;
      for (int j = 0; j < total; ++j) {
        double dot = 0;
        for (int d = 0; d < kD; ++d) dot += double(q[size_t(row * kD + d)]) * k[size_t(j * kD + d)];
        sc[size_t(j)] = visible[size_t(row)][size_t(j)] ? dot * 0.125 : -INFINITY;
        mx = std::max(mx, sc[size_t(j)]);
      }
      if (std::isinf(mx)) {
        EXPECT_TRUE(std::isinf(fin.lse) && fin.lse < 0) << "row " << row;
        EXPECT_EQ(fin.o_scale, 0.0f) << "row " << row;
        continue;
      }
      double sum = 0;
      for (double x : sc) sum += std::isinf(x) ? 0.0 : std::exp(x - mx);
      EXPECT_NEAR(fin.lse, mx + std::log(sum), 1e-5) << "row " << row;
      for (int dt = 0; dt < kDTiles; ++dt) {
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          const int dim = dt * 8 + frag::acc_element(lane, e).col;
          double want = 0;
          for (int j = 0; j < total; ++j) {
            if (!std::isinf(sc[size_t(j)]))
              want += std::exp(sc[size_t(j)] - mx) / sum * v[size_t(j * kD + dim)];
          }
          EXPECT_NEAR(o[lane][dt][e] * fin.o_scale, 2.0 * want, 1e-5)
              << "row " << row << " dim " << dim;
        }
      }
    }
  }
}

// Issue 11: the sink joins the row's denominator at the finish (scores in log2 units, the sink a
// natural-log logit); a row with no visible key gives o = 0 and lse = sink; finishing with the
// sink equals finishing without it and then merging with a value-less state of lse = sink (what
// the split-KV merge does).
TEST(Fa2OnlineSoftmaxTest, FinishRowWithSinkJoinsTheDenominator) {
  constexpr double kLog2e = 1.4426950408889634;
  for (float sink : {-3.0f, 0.0f, 2.5f, 40.0f}) {
    const RowFinish empty = finish_row_with_sink(-INFINITY, 0.0f, 2.0f, sink);
    EXPECT_EQ(empty.o_scale, 0.0f);
    EXPECT_EQ(empty.lse, sink);
    // Two keys with natural scores 1 and -0.5: m = 1 log2 e, sum = 1 + e^-1.5.
    const float m = float(1.0 * kLog2e);
    const float sum = float(1.0 + std::exp(-1.5));
    const RowFinish fin = finish_row_with_sink(m, sum, 2.0f, sink);
    const double denom = std::exp(1.0) + std::exp(-0.5) + std::exp(double(sink));
    EXPECT_NEAR(fin.lse, std::log(denom), 2e-6 * std::max(1.0, std::fabs(std::log(denom))));
    // o = acc * o_scale where acc holds the weights e^(s - 1) (relative to the row max), so
    // o_scale = v_scale * e^1 / denom.
    const double want = 2.0 * std::exp(1.0) / denom;
    EXPECT_NEAR(fin.o_scale, want, 1e-6 * want);
    const RowFinish plain = finish_row(m, sum, 2.0f);
    const math::MergeWeights w = math::merge_weights(plain.lse, sink);
    EXPECT_NEAR(fin.lse, w.lse, 1e-5);
    EXPECT_NEAR(fin.o_scale, plain.o_scale * w.w_a, 1e-6 * plain.o_scale);
  }
}

TEST(Fa2FragmentLayoutTest, WarpAttentionOverBlocksMatchesAPlainSoftmax) {
  for (int blocks : {1, 3}) check_warp_attention(blocks, uint32_t(blocks));
}

// Numerics policy (docs/cuda.md): the kernel's online-softmax steps on a row whose visible scores
// are all NaN (the max skips them), or partly NaN, finish as o = NaN and lse = NaN, with or
// without a sink, never as an empty row (o = 0, lse = -inf or the sink).
TEST(OnlineSoftmaxReplay, NanScoresFinishAsNanRows) {
  constexpr int kNTiles = 2, kDTiles = 1;
  for (bool all_nan : {false, true}) {  // a NaN among finite scores, then every score NaN
    float s[kNTiles][4], o[kDTiles][4] = {{1, 1, 1, 1}};
    for (int nt = 0; nt < kNTiles; ++nt) {
      // Half 0 (the row this lane's elements 0 and 1 belong to); half 1 stays finite.
      s[nt][0] = s[nt][1] = all_nan ? NAN : 0.5f;
      s[nt][2] = s[nt][3] = 0.5f;
    }
    s[0][0] = NAN;
    float m = -INFINITY, l = 0.0f;
    softmax_block_update(s, o, m, l, /*half=*/0, lane_block_max(s, 0));
    for (const RowFinish fin : {finish_row(m, l, 1.0f), finish_row_with_sink(m, l, 1.0f, 0.25f)}) {
      EXPECT_TRUE(std::isnan(fin.lse)) << "all NaN " << all_nan << ": lse " << fin.lse;
      EXPECT_TRUE(std::isnan(o[0][0] * fin.o_scale)) << "all NaN " << all_nan;
    }
  }
  // An empty row still finishes as o = 0, lse = -inf (or the sink).
  EXPECT_EQ(finish_row(-INFINITY, 0.0f, 1.0f).o_scale, 0.0f);
  EXPECT_EQ(finish_row(-INFINITY, 0.0f, 1.0f).lse, -INFINITY);
  EXPECT_EQ(finish_row_with_sink(-INFINITY, 0.0f, 1.0f, 0.25f).lse, 0.25f);
}

// guarded_pv (the PV of a block whose V tile holds inf or NaN) over an emulated warp: each lane's
// outputs equal the plain sum over the keys its row gives a non-zero probability, so a key that
// is masked for one row (p = 0) and holds inf / NaN in V leaves that row finite, while a row that
// sees it gets the inf / NaN, as the reference does.
TEST(GuardedPvReplay, MaskedKeysWithNonFiniteValuesAddNothing) {
  constexpr int kKeys = 32, kNTiles = kKeys / 8, kDvo = 16, kDTiles = kDvo / 8;
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  float p[16][kKeys], v[kKeys][kDvo];
  for (auto& row : v)
    for (float& x : row) x = u(rng) - 0.5f;
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < kKeys; ++j) p[i][j] = j <= i + 8 ? u(rng) : 0.0f;  // causal-like mask
  }
  v[20][3] = INFINITY;  // key 20: visible to rows 12..15 only
  v[27][0] = NAN;       // key 27: masked for every row (row 15 sees keys <= 23)
  v[5][7] = -INFINITY;  // key 5: visible to every row
  // Each lane's S registers hold its probabilities (acc_element layout).
  float s_all[32][kNTiles][4];
  for (int lane = 0; lane < 32; ++lane) {
    for (int nt = 0; nt < kNTiles; ++nt) {
      for (int e = 0; e < 4; ++e) {
        const frag::RowCol rc = frag::acc_element(lane, e);
        s_all[lane][nt][e] = p[rc.row][nt * 8 + rc.col];
      }
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    float o[kDTiles][4] = {};
    guarded_pv<kNTiles, kDTiles>(
        o, lane, [&](int nt, int e, int q) { return s_all[(lane & ~3) | q][nt][e]; },
        [&](int j, int d) { return v[j][d]; });
    for (int dt = 0; dt < kDTiles; ++dt) {
      for (int e = 0; e < 4; ++e) {
        const frag::RowCol rc = frag::acc_element(lane, e);
        const int row = rc.row, d = dt * 8 + rc.col;
        double expect = 0.0;
        for (int j = 0; j < kKeys; ++j) {
          if (p[row][j] != 0.0f) expect += double(p[row][j]) * double(v[j][d]);
        }
        if (std::isnan(expect)) {
          EXPECT_TRUE(std::isnan(o[dt][e])) << "row " << row << " dim " << d;
        } else if (std::isinf(expect)) {
          EXPECT_EQ(o[dt][e], float(expect)) << "row " << row << " dim " << d;
        } else {
          EXPECT_NEAR(o[dt][e], expect, 1e-5) << "row " << row << " dim " << d;
        }
      }
    }
  }
  // The cases the test is about: row 0 does not see key 20, row 13 does; dim 7 sees -inf.
  float o0[kDTiles][4] = {};
  guarded_pv<kNTiles, kDTiles>(
      o0, 0, [&](int nt, int e, int q) { return s_all[q][nt][e]; },
      [&](int j, int d) { return v[j][d]; });
  EXPECT_TRUE(std::isfinite(o0[0][0])) << "row 0, dim 0 (key 27 NaN masked)";
}

}  // namespace
}  // namespace kvattn::fa2
