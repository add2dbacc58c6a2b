// Random attention cases for tests, the command line and benchmarks: owned host buffers in any
// layout (NHD/HND, separate or combined K/V cache, shuffled pages), and the AttentionArgs that
// view them. Not part of the installed library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/problem.h"

namespace kvattn::testing {

struct CaseSpec {
  Problem problem;
  // Per request. Decode ops: qo_lens is ignored (1 each). Single ops: exactly one entry.
  // Empty qo_lens for prefill means qo_len = kv_len per request.
  std::vector<int64_t> qo_lens;
  std::vector<int64_t> kv_lens;
  uint64_t seed = 1;
  bool shuffle_pages = true;     // pages of a request in random order across the pool
  int extra_pages = 1;           // unused pages in the pool, filled with garbage
  bool combined_kv_cache = false;  // one [P, 2, ...] buffer; K and V are strided views of it
  float value_range = 1.0f;      // q, k, v uniform in [-r, r] (before quantizing to the dtype)
  double custom_mask_density = 0.6;  // probability that a custom-mask bit is 1
  bool packed_custom_mask = false;
  bool nan_fill_outputs = true;  // outputs start as NaN so a skipped write shows
  // Problem::use_sinks: sinks uniform in [-r, r] (args() passes them). Per-head / per-(token,
  // head) K/V scales (Problem::kv_scale_granularity) are uniform in [scale_min, scale_max]; unused
  // slots of a per-(token, head) scale cache hold NaN.
  float sink_range = 2.0f;
  float scale_min = 0.25f, scale_max = 2.0f;
  // Per-layer run values: args() carries the scalars and, with return_lse, an lse output.
  RunScalars scalars;
  bool return_lse = false;
};

// A case owns its buffers; args() views them. Movable, not copyable (views point inside).
class Case {
 public:
  static Case make(const CaseSpec& spec);

  Case(Case&&) = default;
  Case& operator=(Case&&) = default;
  Case(const Case&) = delete;
  Case& operator=(const Case&) = delete;

  const Problem& problem() const { return spec_.problem; }
  const CaseSpec& spec() const { return spec_; }
  int64_t total_qo() const { return total_qo_; }
  int64_t total_kv() const { return total_kv_; }
  const std::vector<int64_t>& qo_lens() const { return qo_lens_; }
  const std::vector<int64_t>& kv_lens() const { return kv_lens_; }

  // Inputs and this case's own outputs.
  AttentionArgs args();
  // The same inputs with another pair of outputs (e.g. the reference's), allocated here:
  // out [N, H_qo, D_vo] of `o_dtype`, lse f32 [N, H_qo].
  AttentionArgs args_with_fresh_outputs(DType o_dtype);

  // Outputs of the last args() / args_with_fresh_outputs() as f32 (reading the o dtype).
  std::vector<float> out_f32() const;
  std::vector<float> lse_f32() const;
  std::vector<float> fresh_out_f32() const;
  std::vector<float> fresh_lse_f32() const;

  // Byte counts actually read and written by one attention call (for GB/s).
  int64_t bytes_moved() const;
  // FLOPs by DESIGN.md §5 (causal counted as (2*Lkv - Lq)*Lq).
  double flops() const;

  // Raw buffers (host). Index tensors are int32. MLA: q holds q_nope, q_pe q_pe, k_cache the ckv
  // cache and v_cache the kpe cache.
  std::vector<std::byte> q, q_pe, k, v, kv_cache, k_cache, v_cache, custom_mask;
  // f32: sinks [H_qo]; k_scale, v_scale [H_kv]; k/v_scale_cache [P, page_size, H_kv] (paged) or
  // [total_kv, H_kv].
  std::vector<std::byte> sinks, k_scale, v_scale, k_scale_cache, v_scale_cache;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
  std::vector<std::byte> out, lse, fresh_out, fresh_lse;
  int64_t num_pages = 0;

 private:
  Case() = default;
  AttentionArgs inputs() const;
  void make_mla_inputs(std::mt19937_64& rng);
  CaseSpec spec_;
  std::vector<int64_t> qo_lens_, kv_lens_;
  DType fresh_o_dtype_ = DType::kF32;
  int64_t total_qo_ = 0, total_kv_ = 0;
};

// Converts `n` elements of `dtype` at `data` (contiguous) to f32 / from f32.
void to_f32(const void* data, DType dtype, int64_t n, float* out);
void from_f32(const float* in, int64_t n, DType dtype, void* data);
// Reads a strided view element-wise into a contiguous f32 vector (row-major order of its shape).
std::vector<float> view_to_f32(const TensorView& t);

}  // namespace kvattn::testing
