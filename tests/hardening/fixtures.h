// Small valid calls of every operation, built by hand so that a test can break exactly one thing
// and know which error it must get. All values are f32 (the dtypes under test are changed on the
// views and the Problem), every view's buffer_bytes is its exact extent.
#pragma once

#include <cstdint>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/problem.h"

namespace kvattn::hardening {

// The batch: 3 requests, qo_lens {2, 1, 3}, kv_lens {5, 0, 9}; page size 4 (request 1 has no
// pages), 7 pages in the pool. Single ops: qo_len 3 (decode 1), kv_len 7.
// H_qo 4, H_kv 2, D_qk 8, D_vo 6 (different, so that a qk/vo mix-up is caught).
struct AttentionFixture {
  explicit AttentionFixture(Op op, MaskMode mask = MaskMode::kNone, bool packed_mask = false,
                            KVLayout layout = KVLayout::kNHD);
  AttentionFixture(const AttentionFixture&) = delete;
  AttentionFixture& operator=(const AttentionFixture&) = delete;

  Problem problem;
  std::vector<float> q, k, v, k_cache, v_cache, out, lse, alibi_slopes;
  // Filled by the tests that turn the variants on (sinks, per-head / per-(token, head) scales).
  std::vector<float> sinks, k_scale, v_scale, k_scale_cache, v_scale_cache;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
  std::vector<uint8_t> custom_mask;
  AttentionArgs args;
  int64_t num_pages = 0;
};

// merge_state over N 5, H 2, D 8; merge_states with S 3 states.
struct MergeFixture {
  MergeFixture();
  MergeFixture(const MergeFixture&) = delete;
  MergeFixture& operator=(const MergeFixture&) = delete;

  std::vector<float> v_a, s_a, v_b, s_b, v_out, s_out, v_many, s_many, v_merged, s_merged;
  TensorView tv_a, ts_a, tv_b, ts_b, tv_out, ts_out;  // merge_state
  TensorView tv_many, ts_many, tv_merged, ts_merged;  // merge_states
};

// Appends 4 tokens of H_kv 2, D 8 into the fixture's page table (page size 4, 7 pages, kv_lens
// {5, 0, 9}) at (batch, position) (0, 3), (0, 4), (2, 8), (2, 0).
struct AppendFixture {
  explicit AppendFixture(DType cache_dtype = DType::kF32, KVLayout layout = KVLayout::kNHD);
  AppendFixture(const AppendFixture&) = delete;
  AppendFixture& operator=(const AppendFixture&) = delete;

  std::vector<float> append_k, append_v;
  std::vector<uint8_t> k_cache, v_cache;  // bytes of the cache dtype
  std::vector<int32_t> kv_indptr, kv_indices, kv_last_page_len, batch_indices, positions;
  TensorView tappend_k, tappend_v, tbatch_indices, tpositions;
  PagedKVCache cache;
};

// RoPE over nnz 5 tokens, H_qo 4, H_kv 2, D 8, positions {0, 1, 2, 3, 100}, out of place.
struct RopeFixture {
  RopeFixture();
  RopeFixture(const RopeFixture&) = delete;
  RopeFixture& operator=(const RopeFixture&) = delete;

  std::vector<float> q, k, q_out, k_out;
  std::vector<int32_t> pos_ids;
  TensorView tq, tk, tq_out, tk_out, tpos_ids;
  RopeParams rope;
};

// A view of `v` as f32 / i32 / u8 with the given shape (contiguous, exact buffer_bytes).
TensorView f32_view(std::vector<float>& v, std::initializer_list<int64_t> shape);
TensorView i32_view(std::vector<int32_t>& v);
TensorView u8_view(std::vector<uint8_t>& v);

}  // namespace kvattn::hardening
