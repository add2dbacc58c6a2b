// The numerics policy (docs/cuda.md) in the prefill kernels' PV step: a key masked for a row adds
// nothing to it, even when its V holds an inf or NaN, where the outer products would add the
// key's zero weight times that V (0 * inf = NaN). A kernel asks any_non_finite* once for each KV
// tile that masks some key (fully visible tiles, and tiles of finite V, pay nothing more); when
// it says yes, add_non_finite_*values adds each key whose V row is not finite to the rows that
// give it a weight other than 0, itself, and zeroes that key's weights and V row, so that the
// tile's product adds nothing for it. A weight of 0 is skipped also for a key every row sees (its
// exp2 underflowed), as fa2's guarded_pv does.
//
// Plain C++ over the kernels' scratch layouts, included inside the namespace of each kernel file
// (kernel.h, prefill_avx512_bf16.cc) and of its test (tests/cpu/prefill_masked_value_test.cc),
// so each ISA's copy is built with its own flags. Needs <cstdint> and <cstring>.

// Whether any of the n floats at x is inf or NaN (every exponent bit set): the largest exponent
// field, a max reduction the compiler vectorizes (an and and a max per vector).
inline bool any_non_finite(const float* x, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    const uint32_t exponent = u & 0x7f800000u;
    top = top > exponent ? top : exponent;
  }
  return top == 0x7f800000u;
}

// Whether any of the first n floats of `rows` rows `pitch` floats apart is inf or NaN.
inline bool any_non_finite_rows(const float* x, int rows, int n, int64_t pitch) {
  for (int r = 0; r < rows; ++r) {
    if (any_non_finite(x + r * pitch, n)) return true;
  }
  return false;
}

// The f32 layout (kernel.h): P^T [keys][rows_pad], V [keys][v_pitch] (dvo used), O^T
// [dvo][rows_pad].
inline void add_non_finite_values(int keys, int rows, int64_t rows_pad, int dvo, int64_t v_pitch,
                                  float* pt, float* vf, float* ot) {
  for (int jj = 0; jj < keys; ++jj) {
    float* v = vf + int64_t{jj} * v_pitch;
    if (!any_non_finite(v, dvo)) continue;
    float* pj = pt + jj * rows_pad;
    for (int r = 0; r < rows; ++r) {
      if (pj[r] == 0.0f) continue;
      for (int d = 0; d < dvo; ++d) ot[d * rows_pad + r] += pj[r] * v[d];
    }
    for (int64_t r = 0; r < rows_pad; ++r) pj[r] = 0.0f;
    for (int d = 0; d < dvo; ++d) v[d] = 0.0f;
  }
}

// Whether any bf16 half of the n pair words at x is inf or NaN (as any_non_finite, per half).
inline bool any_non_finite_pairs(const uint32_t* x, int64_t n) {
  uint32_t top_lo = 0, top_hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t lo = x[i] & 0x7f80u, hi = x[i] & 0x7f800000u;
    top_lo = top_lo > lo ? top_lo : lo;
    top_hi = top_hi > hi ? top_hi : hi;
  }
  return top_lo == 0x7f80u || top_hi == 0x7f800000u;
}

inline float bf16_bits_to_f32(uint32_t bits) {
  const uint32_t u = bits << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The bf16 pair layout (prefill_avx512_bf16.cc): P^T pair words [pairs][rows_pad] and V pair
// words [pairs][dvo], key 2p in the low half and key 2p + 1 in the high half; O^T as above. The
// weight added is the bf16 P the dot products would have used.
inline void add_non_finite_pair_values(int keys, int rows, int64_t rows_pad, int dvo, uint32_t* pp,
                                       uint32_t* vp, float* ot) {
  for (int jj = 0; jj < keys; ++jj) {
    const int shift = 16 * (jj % 2);
    uint32_t* v = vp + int64_t{jj / 2} * dvo;
    bool bad = false;
    for (int d = 0; d < dvo; ++d) bad |= ((v[d] >> shift) & 0x7f80u) == 0x7f80u;
    if (!bad) continue;
    uint32_t* pw = pp + int64_t{jj / 2} * rows_pad;
    for (int r = 0; r < rows; ++r) {
      const uint32_t weight = (pw[r] >> shift) & 0xffffu;
      if (weight == 0) continue;  // P >= 0: its bits are 0 exactly when it is +0
      const float w = bf16_bits_to_f32(weight);
      for (int d = 0; d < dvo; ++d) {
        ot[d * rows_pad + r] += w * bf16_bits_to_f32((v[d] >> shift) & 0xffffu);
      }
    }
    const uint32_t keep = ~(0xffffu << shift);
    for (int64_t r = 0; r < rows_pad; ++r) pw[r] &= keep;
    for (int d = 0; d < dvo; ++d) v[d] &= keep;
  }
}
