#include "hardening/fixtures.h"

#include <cstdint>

namespace kvattn::hardening {
namespace {

constexpr int kBatch = 3;
constexpr int kQoHeads = 4, kKvHeads = 2, kDimQk = 8, kDimVo = 6, kPageSize = 4;
constexpr int64_t kNumPages = 7;
constexpr int64_t kSingleQo = 3, kSingleKv = 7;

// Deterministic values in [-1, 1]: validation never reads them, the baseline runs do.
void fill(std::vector<float>* v, std::size_t n, uint32_t seed) {
  v->resize(n);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : *v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  }
}

// The shared page table of the batch: kv_lens {5, 0, 9} in pages of 4, pages in a shuffled
// order inside a pool of 7.
void fill_page_table(std::vector<int32_t>* indptr, std::vector<int32_t>* indices,
                     std::vector<int32_t>* last_page_len) {
  *indptr = {0, 2, 2, 5};
  *indices = {6, 1, 3, 0, 4};
  *last_page_len = {1, 0, 1};
}

}  // namespace

TensorView f32_view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::kF32, shape);
}
TensorView i32_view(std::vector<int32_t>& v) {
  return TensorView::contiguous(v.data(), DType::kI32, {static_cast<int64_t>(v.size())});
}
TensorView u8_view(std::vector<uint8_t>& v) {
  return TensorView::contiguous(v.data(), DType::kU8, {static_cast<int64_t>(v.size())});
}

AttentionFixture::AttentionFixture(Op op, MaskMode mask, bool packed_mask, KVLayout layout) {
  Problem& p = problem;
  p.op = op;
  p.batch_size = is_batch(op) ? kBatch : 1;
  p.num_qo_heads = kQoHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim_qk = kDimQk;
  p.head_dim_vo = kDimVo;
  p.page_size = kPageSize;
  p.kv_layout = layout;
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kF32;
  p.mask_mode = mask;

  std::vector<int64_t> qo_lens, kv_lens;
  if (is_batch(op)) {
    qo_lens =
        op == Op::kBatchDecode ? std::vector<int64_t>{1, 1, 1} : std::vector<int64_t>{2, 1, 3};
    kv_lens = {5, 0, 9};
  } else {
    qo_lens = {op == Op::kSingleDecode ? 1 : kSingleQo};
    kv_lens = {kSingleKv};
  }
  int64_t rows = 0, keys = 0;
  for (int64_t n : qo_lens) rows += n;
  for (int64_t n : kv_lens) keys += n;

  const int64_t hq = kQoHeads, hk = kKvHeads, dqk = kDimQk, dvo = kDimVo;
  fill(&q, rows * hq * dqk, 1);
  out.assign(rows * hq * dvo, 0.0f);
  lse.assign(rows * hq, 0.0f);
  if (op == Op::kSingleDecode) {
    args.q = f32_view(q, {hq, dqk});
    args.out = f32_view(out, {hq, dvo});
    args.lse = f32_view(lse, {hq});
  } else {
    args.q = f32_view(q, {rows, hq, dqk});
    args.out = f32_view(out, {rows, hq, dvo});
    args.lse = f32_view(lse, {rows, hq});
  }
  if (op == Op::kBatchPrefillPaged || op == Op::kBatchPrefillRagged) {
    qo_indptr = {0, 2, 3, 6};
    args.qo_indptr = i32_view(qo_indptr);
  }
  if (!is_batch(op) || op == Op::kBatchPrefillRagged) {
    fill(&k, keys * hk * dqk, 2);
    fill(&v, keys * hk * dvo, 3);
    if (layout == KVLayout::kHND && !is_batch(op)) {
      args.k = f32_view(k, {hk, keys, dqk});
      args.v = f32_view(v, {hk, keys, dvo});
    } else {
      args.k = f32_view(k, {keys, hk, dqk});
      args.v = f32_view(v, {keys, hk, dvo});
    }
  }
  if (op == Op::kBatchPrefillRagged) {
    kv_indptr = {0, 5, 5, 14};
    args.kv_indptr = i32_view(kv_indptr);
  }
  if (is_paged(op)) {
    num_pages = kNumPages;
    fill(&k_cache, num_pages * kPageSize * hk * dqk, 4);
    fill(&v_cache, num_pages * kPageSize * hk * dvo, 5);
    if (layout == KVLayout::kNHD) {
      args.paged_k_cache = f32_view(k_cache, {num_pages, kPageSize, hk, dqk});
      args.paged_v_cache = f32_view(v_cache, {num_pages, kPageSize, hk, dvo});
    } else {
      args.paged_k_cache = f32_view(k_cache, {num_pages, hk, kPageSize, dqk});
      args.paged_v_cache = f32_view(v_cache, {num_pages, hk, kPageSize, dvo});
    }
    fill_page_table(&kv_indptr, &kv_indices, &kv_last_page_len);
    args.kv_indptr = i32_view(kv_indptr);
    args.kv_indices = i32_view(kv_indices);
    args.kv_last_page_len = i32_view(kv_last_page_len);
  }
  if (mask == MaskMode::kCustom) {
    // Per request qo_len x kv_len entries, as bytes or as bits starting at a byte boundary.
    for (std::size_t b = 0; b < qo_lens.size(); ++b) {
      const int64_t entries = qo_lens[b] * kv_lens[b];
      const int64_t bytes = packed_mask ? (entries + 7) / 8 : entries;
      for (int64_t i = 0; i < bytes; ++i) {
        custom_mask.push_back(packed_mask ? static_cast<uint8_t>(0xA5 ^ i) : (i % 3 != 0));
      }
    }
    args.custom_mask = u8_view(custom_mask);
    args.custom_mask_packed = packed_mask;
  }
}

MergeFixture::MergeFixture() {
  constexpr int64_t n = 5, h = 2, d = 8, s = 3;
  fill(&v_a, n * h * d, 11);
  fill(&v_b, n * h * d, 12);
  fill(&s_a, n * h, 13);
  fill(&s_b, n * h, 14);
  v_out.assign(n * h * d, 0.0f);
  s_out.assign(n * h, 0.0f);
  tv_a = f32_view(v_a, {n, h, d});
  tv_b = f32_view(v_b, {n, h, d});
  ts_a = f32_view(s_a, {n, h});
  ts_b = f32_view(s_b, {n, h});
  tv_out = f32_view(v_out, {n, h, d});
  ts_out = f32_view(s_out, {n, h});
  fill(&v_many, n * s * h * d, 15);
  fill(&s_many, n * s * h, 16);
  v_merged.assign(n * h * d, 0.0f);
  s_merged.assign(n * h, 0.0f);
  tv_many = f32_view(v_many, {n, s, h, d});
  ts_many = f32_view(s_many, {n, s, h});
  tv_merged = f32_view(v_merged, {n, h, d});
  ts_merged = f32_view(s_merged, {n, h});
}

AppendFixture::AppendFixture(DType cache_dtype, KVLayout layout) {
  constexpr int64_t nnz = 4, hk = kKvHeads, d = kDimQk;
  fill(&append_k, nnz * hk * d, 21);
  fill(&append_v, nnz * hk * d, 22);
  const std::size_t cache_bytes = kNumPages * kPageSize * hk * d * dtype_size(cache_dtype);
  k_cache.assign(cache_bytes, 0);
  v_cache.assign(cache_bytes, 0);
  fill_page_table(&kv_indptr, &kv_indices, &kv_last_page_len);
  batch_indices = {0, 0, 2, 2};
  positions = {3, 4, 8, 0};
  tappend_k = f32_view(append_k, {nnz, hk, d});
  tappend_v = f32_view(append_v, {nnz, hk, d});
  tbatch_indices = i32_view(batch_indices);
  tpositions = i32_view(positions);
  const bool nhd = layout == KVLayout::kNHD;
  cache.k_cache = TensorView::contiguous(
      k_cache.data(), cache_dtype, {kNumPages, nhd ? kPageSize : hk, nhd ? hk : kPageSize, d});
  cache.v_cache = TensorView::contiguous(
      v_cache.data(), cache_dtype, {kNumPages, nhd ? kPageSize : hk, nhd ? hk : kPageSize, d});
  cache.kv_indptr = i32_view(kv_indptr);
  cache.kv_indices = i32_view(kv_indices);
  cache.kv_last_page_len = i32_view(kv_last_page_len);
  cache.layout = layout;
}

RopeFixture::RopeFixture() {
  constexpr int64_t nnz = 5, hq = kQoHeads, hk = kKvHeads, d = kDimQk;
  fill(&q, nnz * hq * d, 31);
  fill(&k, nnz * hk * d, 32);
  q_out.assign(q.size(), 0.0f);
  k_out.assign(k.size(), 0.0f);
  pos_ids = {0, 1, 2, 3, 100};
  tq = f32_view(q, {nnz, hq, d});
  tk = f32_view(k, {nnz, hk, d});
  tq_out = f32_view(q_out, {nnz, hq, d});
  tk_out = f32_view(k_out, {nnz, hk, d});
  tpos_ids = i32_view(pos_ids);
}

}  // namespace kvattn::hardening
