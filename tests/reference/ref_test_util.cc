#include "reference/ref_test_util.h"

#include <algorithm>

namespace kvattn::reftest {
namespace {

std::vector<std::byte> concat(const std::vector<std::vector<std::byte>>& parts) {
  std::vector<std::byte> all;
  for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

std::vector<int32_t> indptr_of(const std::vector<int64_t>& lens) {
  std::vector<int32_t> indptr(1, 0);
  for (int64_t len : lens) indptr.push_back(indptr.back() + static_cast<int32_t>(len));
  return indptr;
}

TensorView index_view(std::vector<int32_t>& v) {
  return TensorView::contiguous(v.data(), DType::kI32, {static_cast<int64_t>(v.size())});
}

Result run_with_outputs(Problem p, AttentionArgs a, int64_t total_qo) {
  p.o_dtype = DType::kF32;
  Result r;
  r.out.assign(total_qo * p.num_qo_heads * p.head_dim_vo, NAN);
  r.lse.assign(total_qo * p.num_qo_heads, NAN);
  if (p.op == Op::kSingleDecode) {
    a.out = TensorView::contiguous(r.out.data(), DType::kF32, {p.num_qo_heads, p.head_dim_vo});
    a.lse = TensorView::contiguous(r.lse.data(), DType::kF32, {p.num_qo_heads});
  } else {
    a.out = TensorView::contiguous(r.out.data(), DType::kF32,
                                   {total_qo, p.num_qo_heads, p.head_dim_vo});
    a.lse = TensorView::contiguous(r.lse.data(), DType::kF32, {total_qo, p.num_qo_heads});
  }
  Status st = run_reference(p, a);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return r;
}

}  // namespace

Result run_single(const Batch& batch, int b, bool decode, KVLayout layout) {
  Problem p = batch.p;
  p.op = decode ? Op::kSingleDecode : Op::kSinglePrefill;
  p.batch_size = 1;
  p.kv_layout = layout;
  std::vector<std::byte> q = batch.q[b], k = batch.k[b], v = batch.v[b];
  const int64_t kv = batch.kv_lens[b], hk = p.num_kv_heads;
  const std::size_t es = batch.kv_esize();
  // HND: the test transposes [kv, H, D] -> [H, kv, D] itself.
  auto to_hnd = [&](std::vector<std::byte>& t, int64_t dim) {
    std::vector<std::byte> r(t.size());
    for (int64_t j = 0; j < kv; ++j) {
      for (int64_t h = 0; h < hk; ++h) {
        std::memcpy(&r[((h * kv + j) * dim) * es], &t[((j * hk + h) * dim) * es], dim * es);
      }
    }
    t = std::move(r);
  };
  if (layout == KVLayout::kHND) {
    to_hnd(k, p.head_dim_qk);
    to_hnd(v, p.head_dim_vo);
  }
  AttentionArgs a;
  const int64_t hq = p.num_qo_heads;
  a.q = decode ? TensorView::contiguous(q.data(), p.q_dtype, {hq, p.head_dim_qk})
               : TensorView::contiguous(q.data(), p.q_dtype, {batch.qo_lens[b], hq, p.head_dim_qk});
  if (layout == KVLayout::kNHD) {
    a.k = TensorView::contiguous(k.data(), p.kv_dtype, {kv, hk, p.head_dim_qk});
    a.v = TensorView::contiguous(v.data(), p.kv_dtype, {kv, hk, p.head_dim_vo});
  } else {
    a.k = TensorView::contiguous(k.data(), p.kv_dtype, {hk, kv, p.head_dim_qk});
    a.v = TensorView::contiguous(v.data(), p.kv_dtype, {hk, kv, p.head_dim_vo});
  }
  a.scalars = batch.scalars;
  return run_with_outputs(p, a, decode ? 1 : batch.qo_lens[b]);
}

Result run_ragged(const Batch& batch) {
  Problem p = batch.p;
  p.op = Op::kBatchPrefillRagged;
  p.batch_size = batch.batch();
  std::vector<std::byte> q = concat(batch.q), k = concat(batch.k), v = concat(batch.v);
  std::vector<int32_t> qo_indptr = indptr_of(batch.qo_lens), kv_indptr = indptr_of(batch.kv_lens);
  const int64_t total_kv = kv_indptr.back(), total_qo = qo_indptr.back();
  AttentionArgs a;
  a.q = TensorView::contiguous(q.data(), p.q_dtype, {total_qo, p.num_qo_heads, p.head_dim_qk});
  a.k = TensorView::contiguous(k.data(), p.kv_dtype, {total_kv, p.num_kv_heads, p.head_dim_qk});
  a.v = TensorView::contiguous(v.data(), p.kv_dtype, {total_kv, p.num_kv_heads, p.head_dim_vo});
  a.qo_indptr = index_view(qo_indptr);
  a.kv_indptr = index_view(kv_indptr);
  a.scalars = batch.scalars;
  return run_with_outputs(p, a, total_qo);
}

Result run_paged(const Batch& batch, const PagedLayout& lay, bool decode) {
  Problem p = batch.p;
  p.op = decode ? Op::kBatchDecode : Op::kBatchPrefillPaged;
  p.batch_size = batch.batch();
  p.page_size = lay.page_size;
  p.kv_layout = lay.layout;
  const int64_t ps = lay.page_size, hk = p.num_kv_heads;
  const int64_t dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const std::size_t es = batch.kv_esize();

  std::vector<int32_t> kv_indptr(1, 0), kv_last_page_len;
  for (int b = 0; b < batch.batch(); ++b) {
    const int64_t pages = (batch.kv_lens[b] + ps - 1) / ps;
    kv_indptr.push_back(kv_indptr.back() + static_cast<int32_t>(pages));
    kv_last_page_len.push_back(pages ? static_cast<int32_t>(batch.kv_lens[b] - (pages - 1) * ps)
                                     : 0);
  }
  const int64_t num_pages = kv_indptr.back() + lay.extra_pages;
  std::vector<int32_t> pool(num_pages);
  std::iota(pool.begin(), pool.end(), 0);
  if (lay.shuffle) {
    std::mt19937_64 rng(lay.seed);
    std::shuffle(pool.begin(), pool.end(), rng);
  }
  std::vector<int32_t> kv_indices(pool.begin(), pool.begin() + kv_indptr.back());

  // Every byte starts as 0xff, a NaN in every float dtype: reading an unused slot shows.
  const int64_t page_k = ps * hk * dqk, page_v = ps * hk * dvo;
  const int64_t k_page_stride = lay.combined ? page_k + page_v : page_k;
  const int64_t v_page_stride = lay.combined ? page_k + page_v : page_v;
  std::vector<std::byte> k_buf(num_pages * k_page_stride * es, std::byte{0xff});
  std::vector<std::byte> v_buf(lay.combined ? 0 : num_pages * page_v * es, std::byte{0xff});
  std::byte* k_base = k_buf.data();
  std::byte* v_base = lay.combined ? k_buf.data() + page_k * es : v_buf.data();
  auto slot_offset = [&](int64_t slot, int64_t h, int64_t dim) {
    return lay.layout == KVLayout::kNHD ? (slot * hk + h) * dim : (h * ps + slot) * dim;
  };
  for (int b = 0; b < batch.batch(); ++b) {
    for (int64_t j = 0; j < batch.kv_lens[b]; ++j) {
      const int64_t page = kv_indices[kv_indptr[b] + j / ps], slot = j % ps;
      for (int64_t h = 0; h < hk; ++h) {
        std::memcpy(k_base + (page * k_page_stride + slot_offset(slot, h, dqk)) * es,
                    &batch.k[b][((j * hk + h) * dqk) * es], dqk * es);
        std::memcpy(v_base + (page * v_page_stride + slot_offset(slot, h, dvo)) * es,
                    &batch.v[b][((j * hk + h) * dvo) * es], dvo * es);
      }
    }
  }
  auto cache_view = [&](std::byte* base, int64_t dim, int64_t page_stride) {
    const bool nhd = lay.layout == KVLayout::kNHD;
    const int64_t shape[4] = {num_pages, nhd ? ps : hk, nhd ? hk : ps, dim};
    const int64_t strides[4] = {page_stride, nhd ? hk * dim : ps * dim, dim, 1};
    return TensorView::strided(base, p.kv_dtype, shape, strides, 4);
  };

  std::vector<std::byte> q = concat(batch.q);
  std::vector<int32_t> qo_indptr = indptr_of(batch.qo_lens);
  const int64_t total_qo = qo_indptr.back();
  AttentionArgs a;
  a.q = decode ? TensorView::contiguous(q.data(), p.q_dtype, {batch.batch(), p.num_qo_heads, dqk})
               : TensorView::contiguous(q.data(), p.q_dtype, {total_qo, p.num_qo_heads, dqk});
  if (!decode) a.qo_indptr = index_view(qo_indptr);
  a.paged_k_cache = cache_view(k_base, dqk, k_page_stride);
  a.paged_v_cache = cache_view(v_base, dvo, v_page_stride);
  a.kv_indptr = index_view(kv_indptr);
  a.kv_indices = index_view(kv_indices);
  a.kv_last_page_len = index_view(kv_last_page_len);
  a.scalars = batch.scalars;
  return run_with_outputs(p, a, total_qo);
}

}  // namespace kvattn::reftest
