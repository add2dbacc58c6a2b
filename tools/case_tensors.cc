#include "tools/case_tensors.h"

#include "core/status_macros.h"

namespace kvattn::io::detail {
namespace {

int64_t index_at(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

Status need_rank(std::string_view name, const TensorView& t, int rank) {
  if (t.empty()) return make_error(ErrorCode::kInvalidShape, name, ": missing");
  if (t.rank != rank) {
    return make_error(ErrorCode::kInvalidShape, name, ": rank ", t.rank, " (shape ",
                      t.shape_string(), "), expected ", rank);
  }
  return Status::Ok();
}

Status need_index_vector(std::string_view name, const TensorView& t, int64_t size) {
  KVATTN_RETURN_IF_ERROR(need_rank(name, t, 1));
  if (t.dtype != DType::kI32) {
    return make_error(ErrorCode::kInvalidDType, name, ": dtype ", dtype_name(t.dtype),
                      ", expected i32");
  }
  if (size >= 0 && t.shape[0] != size) {
    return make_error(ErrorCode::kInvalidShape, name, ": shape ", t.shape_string(), ", expected [",
                      size, "]");
  }
  return Status::Ok();
}

// An indptr [batch + 1]: starts at 0, non-decreasing, ends at `end`. Returns the differences.
Status read_indptr(std::string_view name, const TensorView& t, int64_t batch, int64_t end,
                   std::vector<int64_t>* diffs) {
  KVATTN_RETURN_IF_ERROR(need_index_vector(name, t, batch + 1));
  if (index_at(t, 0) != 0) {
    return make_error(ErrorCode::kInvalidPageTable, name, "[0] = ", index_at(t, 0), ": must be 0");
  }
  diffs->clear();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t lo = index_at(t, b), hi = index_at(t, b + 1);
    if (hi < lo) {
      return make_error(ErrorCode::kInvalidPageTable, name, "[", b + 1, "] = ", hi,
                        " is less than ", name, "[", b, "] = ", lo, ": must be non-decreasing");
    }
    diffs->push_back(hi - lo);
  }
  if (index_at(t, batch) != end) {
    return make_error(ErrorCode::kInvalidPageTable, name, "[", batch, "] = ", index_at(t, batch),
                      ": must equal ", end);
  }
  return Status::Ok();
}

Status paged_lengths(const Problem& p, const AttentionArgs& a, int64_t batch,
                     std::vector<int64_t>* kv_lens) {
  KVATTN_RETURN_IF_ERROR(need_rank("paged_k_cache", a.paged_k_cache, 4));
  KVATTN_RETURN_IF_ERROR(need_rank("paged_v_cache", a.paged_v_cache, 4));
  const int page_dim = p.kv_layout == KVLayout::kNHD ? 1 : 2;
  const int64_t num_pages = a.paged_k_cache.shape[0];
  for (const TensorView* cache : {&a.paged_k_cache, &a.paged_v_cache}) {
    if (cache->shape[0] != num_pages || cache->shape[page_dim] != p.page_size) {
      return make_error(ErrorCode::kInvalidShape,
                        cache == &a.paged_k_cache ? "paged_k_cache" : "paged_v_cache", ": shape ",
                        cache->shape_string(), " does not hold ", num_pages, " pages of page_size ",
                        p.page_size, " in layout ", kv_layout_name(p.kv_layout));
    }
  }
  KVATTN_RETURN_IF_ERROR(need_index_vector("kv_indices", a.kv_indices, -1));
  std::vector<int64_t> pages;
  KVATTN_RETURN_IF_ERROR(
      read_indptr("kv_indptr", a.kv_indptr, batch, a.kv_indices.shape[0], &pages));
  for (int64_t i = 0; i < a.kv_indices.shape[0]; ++i) {
    int64_t page = index_at(a.kv_indices, i);
    if (page < 0 || page >= num_pages) {
      return make_error(ErrorCode::kInvalidPageTable, "kv_indices[", i, "] = ", page,
                        ": must be in [0, ", num_pages, ")");
    }
  }
  KVATTN_RETURN_IF_ERROR(need_index_vector("kv_last_page_len", a.kv_last_page_len, batch));
  kv_lens->clear();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t last = index_at(a.kv_last_page_len, b);
    if (pages[b] == 0) {
      kv_lens->push_back(0);
      continue;
    }
    if (last < 1 || last > p.page_size) {
      return make_error(ErrorCode::kInvalidPageTable, "kv_last_page_len[", b, "] = ", last,
                        ": must be in [1, page_size = ", p.page_size, "]");
    }
    kv_lens->push_back((pages[b] - 1) * p.page_size + last);
  }
  return Status::Ok();
}

// MLA: ragged q_nope / q_pe over the paged latent caches.
Status mla_lengths(const Problem& p, const AttentionArgs& a, int64_t batch,
                   std::vector<int64_t>* qo_lens, std::vector<int64_t>* kv_lens) {
  KVATTN_RETURN_IF_ERROR(need_rank("q_nope", a.q_nope, 3));
  KVATTN_RETURN_IF_ERROR(need_rank("q_pe", a.q_pe, 3));
  if (a.q_pe.shape[0] != a.q_nope.shape[0]) {
    return make_error(ErrorCode::kInvalidShape, "q_pe: shape ", a.q_pe.shape_string(),
                      " holds another number of queries than q_nope ", a.q_nope.shape_string());
  }
  KVATTN_RETURN_IF_ERROR(read_indptr("qo_indptr", a.qo_indptr, batch, a.q_nope.shape[0], qo_lens));
  // The latent caches stand where the K and V caches do: [P, page_size, D] of one KV head.
  AttentionArgs paged;
  paged.paged_k_cache = a.ckv_cache;
  paged.paged_v_cache = a.kpe_cache;
  paged.kv_indptr = a.kv_indptr;
  paged.kv_indices = a.kv_indices;
  paged.kv_last_page_len = a.kv_last_page_len;
  for (TensorView* cache : {&paged.paged_k_cache, &paged.paged_v_cache}) {
    const char* name = cache == &paged.paged_k_cache ? "ckv_cache" : "kpe_cache";
    KVATTN_RETURN_IF_ERROR(need_rank(name, *cache, 3));
    cache->rank = 4;
    cache->shape[3] = cache->shape[2];
    cache->shape[2] = 1;
  }
  return paged_lengths(p, paged, batch, kv_lens);
}

}  // namespace

Status case_request_lengths(const Problem& p, const AttentionArgs& a, std::vector<int64_t>* qo_lens,
                            std::vector<int64_t>* kv_lens) {
  qo_lens->clear();
  kv_lens->clear();
  if (!is_batch(p.op)) {
    KVATTN_RETURN_IF_ERROR(need_rank("q", a.q, p.op == Op::kSingleDecode ? 2 : 3));
    KVATTN_RETURN_IF_ERROR(need_rank("k", a.k, 3));
    KVATTN_RETURN_IF_ERROR(need_rank("v", a.v, 3));
    const int seq_dim = p.kv_layout == KVLayout::kNHD ? 0 : 1;
    if (a.v.shape[seq_dim] != a.k.shape[seq_dim]) {
      return make_error(ErrorCode::kInvalidShape, "v: shape ", a.v.shape_string(),
                        " holds another number of keys than k ", a.k.shape_string());
    }
    qo_lens->push_back(p.op == Op::kSingleDecode ? 1 : a.q.shape[0]);
    kv_lens->push_back(a.k.shape[seq_dim]);
    return Status::Ok();
  }
  const int64_t batch = p.batch_size;
  if (is_mla(p.op)) return mla_lengths(p, a, batch, qo_lens, kv_lens);
  KVATTN_RETURN_IF_ERROR(need_rank("q", a.q, 3));
  if (p.op == Op::kBatchDecode) {
    if (a.q.shape[0] != batch) {
      return make_error(ErrorCode::kInvalidShape, "q: shape ", a.q.shape_string(),
                        ", batch_decode expects [batch_size = ", batch, ", H_qo, D_qk]");
    }
    qo_lens->assign(static_cast<size_t>(batch), 1);
  } else {
    KVATTN_RETURN_IF_ERROR(read_indptr("qo_indptr", a.qo_indptr, batch, a.q.shape[0], qo_lens));
  }
  if (is_paged(p.op)) return paged_lengths(p, a, batch, kv_lens);
  KVATTN_RETURN_IF_ERROR(need_rank("k", a.k, 3));
  KVATTN_RETURN_IF_ERROR(need_rank("v", a.v, 3));
  if (a.v.shape[0] != a.k.shape[0]) {
    return make_error(ErrorCode::kInvalidShape, "v: shape ", a.v.shape_string(),
                      " holds another number of keys than k ", a.k.shape_string());
  }
  return read_indptr("kv_indptr", a.kv_indptr, batch, a.k.shape[0], kv_lens);
}

}  // namespace kvattn::io::detail
