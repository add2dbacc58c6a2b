// The cpu backend's one epilogue, for decode, prefill and MLA: a row's end through
// core/attention_math.h's finish_row (normalize, the sink joining a final row, the natural-log
// LSE, the NaN policy), then its store — a final row in the output's dtype with its LSE in the
// base the caller asked for (lse_store_scale), or a split item's partial state (f32, natural-log
// LSE) for the driver's merge (driver.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/attention_math.h"
#include "kvattn/attention.h"

namespace kvattn::cpu {

// The functions here are compiled once, in epilogue.cc with the baseline flags, and called from
// every ISA's kernel: an inline copy compiled with AVX-512 flags could be the one the linker keeps
// for a kernel of a lower ISA level.

// A row's end. `nan_row`: the kernel saw a NaN it tracks outside the sum (decode's e4m3 NaN
// keys, prefill's NaN running max): o = lse = NaN. `sink`: the head's sink logit for a final row,
// null for a split item's partial (the merge adds the sink once).
math::RowFinish finish_row(float m, float sum, float v_scale, bool nan_row, const float* sink);

// Where final rows go: out [token, head, dim] in its dtype and lse [token, head] (optional),
// from the run's arguments (single decode's rank-2 out [head, dim] is one token).
struct OutputRows {
  std::byte* out = nullptr;
  DType dtype = DType::kF32;
  int64_t stride_token = 0, stride_head = 0, stride_dim = 1;
  float* lse = nullptr;
  float lse_scale = 1.0f;  // natural log -> the base the caller asked for
  int64_t lse_stride_token = 0, lse_stride_head = 0;

  static OutputRows of(const AttentionArgs& args);

  // Row (token, head): `row` (f32, final values) in o's dtype, and its natural-log `lse`.
  void store(int64_t token, int head, const float* row, int dim, float lse_value) const;
  // The same, a unit-stride row converted by the calling kernel's vectors (S::store_convert of
  // simd_<isa>.h, the baseline-compiled store otherwise). S is a kernel file's own type, so each
  // ISA's file instantiates its own copy, as the rule above asks.
  template <class S>
  void store_with(int64_t token, int head, const float* row, int dim, float lse_value) const {
    if (stride_dim != 1) return store(token, head, row, dim, lse_value);
    S::store_convert(row, dim, dtype, row_at(token, head));
    store_lse(token, head, lse_value);
  }
  std::byte* row_at(int64_t token, int head) const {
    return out + (token * stride_token + head * stride_head) * int64_t(dtype_size(dtype));
  }
  void store_lse(int64_t token, int head, float lse_value) const;
};

// Split-KV partial states: state s holds `rows` rows of `dim` normalized outputs (f32) and their
// natural-log LSE, for the driver's merge.
struct PartialStates {
  float* o = nullptr;
  float* lse = nullptr;
  int64_t rows = 0;
  int dim = 0;

  float* row(int64_t state, int64_t r) const { return o + (state * rows + r) * dim; }
  float& lse_of(int64_t state, int64_t r) const { return lse[state * rows + r]; }
};

}  // namespace kvattn::cpu
