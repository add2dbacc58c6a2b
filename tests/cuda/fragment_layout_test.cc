// fa2's warp-level index math (src/cuda/fa2/kernels/fragment_layout.h) replayed on the CPU: an
// emulation of ldmatrix (plain and .trans) and mma.m16n8k16 following the PTX ISA's fragment
// layouts runs the kernel's exact sequence for S = Q K^T and O += P V over swizzled tiles, and
// the result must equal the plain matrix products. Also: the swizzle is a bijection inside each
// row and every ldmatrix phase touches 8 distinct 16-byte bank groups.
#include "cuda/fa2/kernels/fragment_layout.h"

#include <gtest/gtest.h>

#include <array>
#include <random>
#include <set>
#include <vector>

namespace kvattn::fa2 {
namespace {

using Regs = std::array<std::array<float, 2>, 4>;  // four b32 registers of two 16-bit halves
using Warp = std::array<Regs, 32>;
using Acc = std::array<std::array<float, 4>, 32>;  // one m16n8 f32 tile, per lane

// ldmatrix.x4: lane 8i + r gives the address of row r of matrix i (8 consecutive elements).
// Plain: register i of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix i.
// Trans:  register i of lane l holds rows 2(l%4), 2(l%4)+1 at column l/4 of matrix i.
Warp ldmatrix_x4(const std::vector<float>& mem, const std::array<int, 32>& lane_addr, bool trans) {
  Warp out{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      for (int h = 0; h < 2; ++h) {
        if (!trans) {
          out[lane][i][h] = mem[size_t(lane_addr[8 * i + lane / 4] + 2 * (lane % 4) + h)];
        } else {
          out[lane][i][h] = mem[size_t(lane_addr[8 * i + 2 * (lane % 4) + h] + lane / 4)];
        }
      }
    }
  }
  return out;
}

// mma.m16n8k16.row.col: D = A B + D with the PTX fragment layouts (g = lane/4, t = lane%4):
// A a0 (g, 2t+h), a1 (g+8, 2t+h), a2 (g, 2t+8+h), a3 (g+8, 2t+8+h); B b0 (2t+h, g),
// b1 (2t+8+h, g); C c_e (g + 8(e/2), 2t + e%2).
void mma(Acc& d, const Warp& a, const std::array<std::array<std::array<float, 2>, 2>, 32>& b) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = a[lane][0][h];
      A[g + 8][2 * t + h] = a[lane][1][h];
      A[g][2 * t + 8 + h] = a[lane][2][h];
      A[g + 8][2 * t + 8 + h] = a[lane][3][h];
      B[2 * t + h][g] = b[lane][0][h];
      B[2 * t + 8 + h][g] = b[lane][1][h];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
      double sum = 0;
      for (int k = 0; k < 16; ++k) sum += double(A[row][k]) * B[k][col];
      d[lane][e] += float(sum);
    }
  }
}

std::array<std::array<std::array<float, 2>, 2>, 32> pick_b(const Warp& w, int first) {
  std::array<std::array<std::array<float, 2>, 2>, 32> b{};
  for (int lane = 0; lane < 32; ++lane) {
    b[lane][0] = w[lane][first];
    b[lane][1] = w[lane][first + 1];
  }
  return b;
}

// A [rows x D] logical matrix stored swizzled.
std::vector<float> store_swizzled(const std::vector<float>& m, int rows, int d) {
  std::vector<float> mem(m.size());
  std::set<int> seen;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < d; ++c) {
      const int off = frag::swizzled(r, c, d);
      EXPECT_GE(off, r * d);
      EXPECT_LT(off, (r + 1) * d);
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
  const std::vector<float> q_mem = store_swizzled(q, rows, dqk);
  const std::vector<float> k_mem = store_swizzled(k, keys, dqk);
  const std::vector<float> v_mem = store_swizzled(v, keys, dvo);

  // S = Q K^T, as attend_block computes it.
  const int ntiles = keys / 8;
  std::vector<Acc> s(size_t(ntiles), Acc{});
  for (int ks = 0; ks < dqk / 16; ++ks) {
    std::array<int, 32> qa;
    for (int lane = 0; lane < 32; ++lane) {
      frag::RowCol rc = frag::q_ldmatrix(warp, lane, ks);
      qa[size_t(lane)] = frag::swizzled(rc.row, rc.col, dqk);
    }
    expect_conflict_free(qa);
    const Warp a = ldmatrix_x4(q_mem, qa, false);
    for (int nt2 = 0; nt2 < ntiles / 2; ++nt2) {
      std::array<int, 32> ka;
      for (int lane = 0; lane < 32; ++lane) {
        frag::RowCol rc = frag::k_ldmatrix(lane, nt2, ks);
        ka[size_t(lane)] = frag::swizzled(rc.row, rc.col, dqk);
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
        va[size_t(lane)] = frag::swizzled(rc.row, rc.col, dvo);
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
  for (Dims d : {Dims{64, 64}, Dims{128, 128}, Dims{256, 256}, Dims{192, 128}}) {
    const int keys = d.qk > 128 ? 32 : 64;
    for (int warp : {0, 3}) check_warp_tile(d.qk, d.vo, keys, warp);
  }
}

}  // namespace
}  // namespace kvattn::fa2
