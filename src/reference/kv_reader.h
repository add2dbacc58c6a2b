// Where the rows of an attention call live: which element of which view holds query row i of
// request b, and key/value j of request b, for every storage form of DESIGN.md §2 (contiguous
// single K/V in NHD or HND, ragged K/V, paged caches in NHD or HND through the CSR page table).
// Header-only so the test-support baseline reads exactly the same elements.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "core/math_constants.h"
#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "reference/element_io.h"

namespace kvattn::ref {

class AttentionRows {
 public:
  // `args` must have been validated against `problem` (the index tensors are read here).
  AttentionRows(const Problem& problem, const AttentionArgs& args)
      : problem_(problem), args_(args) {
    request_lengths(problem, args, &qo_len_, &kv_len_);
    qo_begin_.assign(problem.batch_size + 1, 0);
    for (int b = 0; b < problem.batch_size; ++b) qo_begin_[b + 1] = qo_begin_[b] + qo_len_[b];
    if (problem.mask_mode == MaskMode::kCustom) build_mask_offsets();
  }

  int batch_size() const { return problem_.batch_size; }
  int64_t qo_len(int b) const { return qo_len_[b]; }
  int64_t kv_len(int b) const { return kv_len_[b]; }
  // Index of query row i of request b among all query rows (the N of [N, H_qo, D]).
  int64_t qo_row(int b, int64_t i) const { return qo_begin_[b] + i; }
  int64_t total_qo() const { return qo_begin_[problem_.batch_size]; }

  // single_decode has no row dimension: q [H, D], out [H, D], lse [H].
  bool rowless() const { return problem_.op == Op::kSingleDecode; }

  double q(int b, int64_t i, int h, int d) const {
    if (is_mla(problem_.op)) {
      // MLA: the query is q_nope then q_pe, d in [0, D_ckv + D_kpe).
      const int d_ckv = problem_.head_dim_ckv;
      return d < d_ckv ? load(args_.q_nope, qo_row(b, i), h, d)
                       : load(args_.q_pe, qo_row(b, i), h, d - d_ckv);
    }
    const TensorView& t = args_.q;
    return rowless() ? load(t, h, d) : load(t, qo_row(b, i), h, d);
  }
  // MLA: the key is ckv then kpe, the value is ckv (one KV head, h = 0), both stored values
  // that k_scale dequantizes (see value_scale()).
  double k(int b, int64_t j, int h, int d) const {
    if (is_mla(problem_.op)) {
      const int d_ckv = problem_.head_dim_ckv;
      return d < d_ckv ? latent(args_.ckv_cache, b, j, d)
                       : latent(args_.kpe_cache, b, j, d - d_ckv);
    }
    return kv(args_.k, args_.paged_k_cache, b, j, h, d);
  }
  double v(int b, int64_t j, int h, int d) const {
    if (is_mla(problem_.op)) return latent(args_.ckv_cache, b, j, d);
    return kv(args_.v, args_.paged_v_cache, b, j, h, d);
  }
  // This layer's q scale (AttentionArgs::scalars).
  float q_scale() const { return args_.scalars.q_scale; }
  // What dequantizes v(): MLA's values are the ckv latents, scaled by k_scale.
  float value_scale() const {
    return is_mla(problem_.op) ? args_.scalars.k_scale : args_.scalars.v_scale;
  }

  // The dequantization scale of key/value j of request b, KV head h: per (token, head) with the
  // problem's kv_scale_granularity, else per head where this layer passes head scales, else the
  // run's float.
  double k_scale(int b, int64_t j, int h) const {
    return scale(args_.scalars.k_scale, args_.k_scale, args_.k_scale_cache, b, j, h);
  }
  double v_scale(int b, int64_t j, int h) const {
    if (is_mla(problem_.op)) return value_scale();  // MLA's values are the k-scaled latents
    return scale(args_.scalars.v_scale, args_.v_scale, args_.v_scale_cache, b, j, h);
  }
  // Whether this layer passes sinks, and the sink logit of query head h.
  bool has_sinks() const { return !args_.sinks.empty(); }
  double sink(int h) const { return load(args_.sinks, h); }
  // Whether this layer returns the LSE (an lse tensor is given).
  bool returns_lse() const { return !args_.lse.empty(); }

  void store_out(int b, int64_t i, int h, int d, double value) const {
    if (rowless()) {
      store(args_.out, value, h, d);
    } else {
      store(args_.out, value, qo_row(b, i), h, d);
    }
  }
  // `value` is the natural LSE; stored in the run's base (-inf and NaN stay as they are).
  void store_lse(int b, int64_t i, int h, double value) const {
    if (args_.scalars.lse_base == LseBase::k2) value *= math::kLog2eF64;
    if (rowless()) {
      store(args_.lse, value, h);
    } else {
      store(args_.lse, value, qo_row(b, i), h);
    }
  }

  // Whether the custom mask lets query i of request b see key j. Unpacked: one byte per (i, j),
  // requests concatenated; packed: the same bits little-endian within a byte, each request
  // starting at a byte boundary.
  bool custom_mask_bit(int b, int64_t i, int64_t j) const {
    const int64_t bit = i * kv_len_[b] + j;
    const auto* bytes = static_cast<const uint8_t*>(args_.custom_mask.data);
    const int64_t stride = args_.custom_mask.strides[0];
    if (!args_.custom_mask_packed) return bytes[(mask_begin_[b] + bit) * stride] != 0;
    const uint8_t byte = bytes[(mask_begin_[b] + (bit >> 3)) * stride];
    return ((byte >> (bit & 7)) & 1) != 0;
  }

 private:
  // Which slot of a [slots..., H_kv] per-(token, head) tensor holds key j of request b: the
  // single ops' [kv_len, H_kv] (both layouts), ragged [nnz_kv, H_kv], paged [P, page_size, H_kv].
  double scale(float per_tensor, const TensorView& per_head, const TensorView& per_token, int b,
               int64_t j, int h) const {
    if (problem_.kv_scale_granularity != KVScaleGranularity::kPerTokenHead) {
      return per_head.empty() ? per_tensor : load(per_head, h);
    }
    switch (problem_.op) {
      case Op::kSingleDecode:
      case Op::kSinglePrefill:
        return load(per_token, j, h);
      case Op::kBatchPrefillRagged:
        return load(per_token, load_i32(args_.kv_indptr, b) + j, h);
      case Op::kBatchDecode:
      case Op::kBatchPrefillPaged: {
        const int64_t page_size = problem_.page_size;
        const int64_t page =
            load_i32(args_.kv_indices, load_i32(args_.kv_indptr, b) + j / page_size);
        return load(per_token, page, j % page_size, h);
      }
      case Op::kBatchMLAPaged:  // MLA takes per-tensor scales only (validate_mla_problem)
        break;
    }
    return 0.0;
  }

  double kv(const TensorView& flat, const TensorView& paged, int b, int64_t j, int h, int d) const {
    switch (problem_.op) {
      case Op::kSingleDecode:
      case Op::kSinglePrefill:
        return problem_.kv_layout == KVLayout::kNHD ? load(flat, j, h, d) : load(flat, h, j, d);
      case Op::kBatchPrefillRagged:
        // Ragged K/V are always NHD, as in FlashInfer.
        return load(flat, load_i32(args_.kv_indptr, b) + j, h, d);
      case Op::kBatchMLAPaged:  // read through latent()
        return 0.0;
      case Op::kBatchDecode:
      case Op::kBatchPrefillPaged: {
        const int64_t page_size = problem_.page_size;
        const int64_t page =
            load_i32(args_.kv_indices, load_i32(args_.kv_indptr, b) + j / page_size);
        const int64_t slot = j % page_size;
        return problem_.kv_layout == KVLayout::kNHD ? load(paged, page, slot, h, d)
                                                    : load(paged, page, h, slot, d);
      }
    }
    return 0.0;
  }

  double latent(const TensorView& cache, int b, int64_t j, int d) const {
    const int64_t page_size = problem_.page_size;
    const int64_t page = load_i32(args_.kv_indices, load_i32(args_.kv_indptr, b) + j / page_size);
    return load(cache, page, j % page_size, d);
  }

  void build_mask_offsets() {
    mask_begin_.assign(problem_.batch_size + 1, 0);
    for (int b = 0; b < problem_.batch_size; ++b) {
      const int64_t bits = qo_len_[b] * kv_len_[b];
      mask_begin_[b + 1] = mask_begin_[b] + (args_.custom_mask_packed ? (bits + 7) / 8 : bits);
    }
  }

  const Problem& problem_;
  const AttentionArgs& args_;
  std::vector<int64_t> qo_len_, kv_len_, qo_begin_;
  std::vector<int64_t> mask_begin_;  // in bytes, per request
};

}  // namespace kvattn::ref
