// Whole-warp emulations of ldmatrix.x4 (plain and .trans) and mma.m16n8k16.row.col, written from
// the PTX ISA's fragment layouts once for every CPU replay of fa2's warp code: the index-math
// replay (fragment_layout_test.cc, float elements) and the CTA emulator (cta_emulator.h, raw
// 16-bit elements read through a format's to_float).
#pragma once

#include <array>

namespace kvattn::fa2::emu {

// A warp's registers of two 16-bit halves: [lane][register][half], half 0 = the low 16 bits.
template <class T, int kRegs>
using WarpRegs = std::array<std::array<std::array<T, 2>, kRegs>, 32>;
// One m16n8 f32 accumulator tile: [lane][element].
using WarpAcc = std::array<std::array<float, 4>, 32>;

// ldmatrix.x4: lane 8i + r gives the address of row r of matrix i (8 consecutive elements).
// Plain: register i of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix i.
// Trans:  register i of lane l holds rows 2(l%4), 2(l%4)+1 at column l/4 of matrix i.
template <class T>
WarpRegs<T, 4> ldmatrix_x4(const std::array<const T*, 32>& rows, bool trans) {
  WarpRegs<T, 4> out{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      for (int h = 0; h < 2; ++h) {
        out[lane][i][h] = trans ? rows[8 * i + 2 * (lane % 4) + h][lane / 4]
                                : rows[8 * i + lane / 4][2 * (lane % 4) + h];
      }
    }
  }
  return out;
}

// mma.m16n8k16.row.col: D = A B + D with the PTX fragment layouts (g = lane/4, t = lane%4,
// h = half): A a0 (g, 2t+h), a1 (g+8, 2t+h), a2 (g, 2t+8+h), a3 (g+8, 2t+8+h);
// B b0 (k = 2t+h, n = g), b1 (k = 2t+8+h, n = g); C/D c_e (g + 8(e/2), 2t + e%2).
// Each dot product is summed in double and added to D once, rounded to float.
// to_float(T) -> float reads an element (the identity for float elements).
template <class T, class ToFloat>
void mma_m16n8k16(WarpAcc& d, const WarpRegs<T, 4>& a, const WarpRegs<T, 2>& b, ToFloat to_float) {
  double A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = double(to_float(a[lane][0][h]));
      A[g + 8][2 * t + h] = double(to_float(a[lane][1][h]));
      A[g][2 * t + 8 + h] = double(to_float(a[lane][2][h]));
      A[g + 8][2 * t + 8 + h] = double(to_float(a[lane][3][h]));
      B[2 * t + h][g] = double(to_float(b[lane][0][h]));
      B[2 * t + 8 + h][g] = double(to_float(b[lane][1][h]));
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
      double sum = 0;
      for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
      d[lane][e] += float(sum);
    }
  }
}

}  // namespace kvattn::fa2::emu
