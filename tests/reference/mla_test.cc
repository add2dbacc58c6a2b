// The reference MLA against its definition (DESIGN.md §2): batch_mla_paged is multi-query
// attention with one KV head whose key is [ckv, kpe], whose value is ckv, and whose query is
// [q_nope, q_pe], all dequantized by k_scale. The reference's batch_prefill_paged on caches built
// that way must give the same bits, for decode and causal prefill, bf16 and fp8 caches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kvattn/attention.h"
#include "testing/case_builder.h"

namespace kvattn {
namespace {

std::vector<std::byte> concat_rows(const std::vector<std::byte>& a, int64_t a_row,
                                   const std::vector<std::byte>& b, int64_t b_row, int64_t rows) {
  std::vector<std::byte> out(static_cast<size_t>(rows * (a_row + b_row)));
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out.data() + r * (a_row + b_row), a.data() + r * a_row, a_row);
    std::memcpy(out.data() + r * (a_row + b_row) + a_row, b.data() + r * b_row, b_row);
  }
  return out;
}

void expect_mla_is_mqa(DType kv, bool causal, std::vector<int64_t> qo, std::vector<int64_t> kvl) {
  testing::CaseSpec spec;
  spec.problem = make_mla_problem(static_cast<int>(kvl.size()), 16, 5, 0.2f, 48, 16);
  Problem& p = spec.problem;
  p.kv_dtype = kv;
  spec.scalars.k_scale = is_fp8(kv) ? 0.75f : 1.0f;
  p.mask_mode = causal ? MaskMode::kCausal : MaskMode::kNone;
  spec.return_lse = true;
  p.o_dtype = DType::kF32;
  spec.qo_lens = qo;
  spec.kv_lens = kvl;
  testing::Case c = testing::Case::make(spec);
  PlanOptions reference;
  reference.backend = "reference";
  ASSERT_TRUE(run(p, c.args(), reference).ok());

  // The same problem as multi-query attention over a [ckv, kpe] key cache and a ckv value cache.
  const int64_t qs = static_cast<int64_t>(dtype_size(p.q_dtype));
  const int64_t ks = static_cast<int64_t>(dtype_size(p.kv_dtype));
  const int64_t h = p.num_qo_heads, ckv = p.head_dim_ckv, kpe = p.head_dim_kpe;
  const int64_t rows = c.total_qo(), slots = c.num_pages * p.page_size;
  std::vector<std::byte> q = concat_rows(c.q, ckv * qs, c.q_pe, kpe * qs, rows * h);
  std::vector<std::byte> k = concat_rows(c.k_cache, ckv * ks, c.v_cache, kpe * ks, slots);
  std::vector<std::byte> v = c.k_cache;
  Problem mqa = p;
  mqa.op = Op::kBatchPrefillPaged;
  AttentionArgs a = c.args_with_fresh_outputs(DType::kF32);
  AttentionArgs m;
  m.q = TensorView::contiguous(q.data(), p.q_dtype, {rows, h, ckv + kpe});
  m.paged_k_cache = TensorView::contiguous(k.data(), kv, {c.num_pages, p.page_size, 1, ckv + kpe});
  m.paged_v_cache = TensorView::contiguous(v.data(), kv, {c.num_pages, p.page_size, 1, ckv});
  m.qo_indptr = a.qo_indptr;
  m.kv_indptr = a.kv_indptr;
  m.kv_indices = a.kv_indices;
  m.kv_last_page_len = a.kv_last_page_len;
  m.out = a.out;
  m.lse = a.lse;
  m.scalars.k_scale = m.scalars.v_scale = spec.scalars.k_scale;
  const Status s = run(mqa, m, reference);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(c.out == c.fresh_out) << "output bits differ";
  EXPECT_TRUE(c.lse == c.fresh_lse) << "lse bits differ";
  // And the outputs are real: no NaN from the garbage-filled unused slots.
  for (float x : c.out_f32()) ASSERT_FALSE(std::isnan(x));
}

TEST(ReferenceMla, IsMultiQueryAttentionOverTheLatents) {
  expect_mla_is_mqa(DType::kBF16, false, {1, 1, 1}, {7, 0, 23});
  expect_mla_is_mqa(DType::kBF16, true, {3, 2, 6}, {7, 1, 4});
  expect_mla_is_mqa(DType::kE4M3, true, {2, 0}, {11, 5});
  expect_mla_is_mqa(DType::kE5M2, false, {1}, {9});
  expect_mla_is_mqa(DType::kF16, true, {4}, {4});
}

}  // namespace
}  // namespace kvattn
