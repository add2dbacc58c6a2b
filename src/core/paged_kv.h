// Where token j of a request lives in a paged KV cache, host and device (DESIGN.md §2 "Paged KV
// cache"): token -> (page, slot) through the CSR page table, (page, slot, head, dim) -> element
// offset through the cache's strides, for NHD and HND alike.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::paged {

// The strides (in elements) of one paged cache tensor, named by meaning rather than by position:
// NHD [P, page_size, H, D] and HND [P, H, page_size, D] differ only in which is which.
struct CacheStrides {
  int64_t page = 0;
  int64_t slot = 0;
  int64_t head = 0;
  int64_t dim = 0;

  KVATTN_HD int64_t offset(int64_t page_id, int64_t slot_in_page, int64_t h, int64_t d) const {
    return page_id * page + slot_in_page * slot + h * head + d * dim;
  }
};
// From the four strides of a rank-4 cache view in its own order.
KVATTN_HD CacheStrides cache_strides(const int64_t* view_strides, bool hnd) {
  CacheStrides s;
  s.page = view_strides[0];
  s.slot = hnd ? view_strides[2] : view_strides[1];
  s.head = hnd ? view_strides[1] : view_strides[2];
  s.dim = view_strides[3];
  return s;
}

struct PageSlot {
  int64_t page;  // page id in the pool
  int64_t slot;  // token within the page
};
// Token j of request b: page kv_indices[kv_indptr[b] + j / page_size], slot j % page_size.
KVATTN_HD PageSlot locate_token(const int32_t* kv_indices, int64_t request_page_begin, int64_t j,
                                int page_size) {
  int64_t page_in_request = j / page_size;
  return PageSlot{int64_t(kv_indices[request_page_begin + page_in_request]), j % page_size};
}

// Tokens of request b: (pages - 1) * page_size + last_page_len, 0 without pages.
KVATTN_HD int64_t request_kv_len(const int32_t* kv_indptr, const int32_t* kv_last_page_len, int b,
                                 int page_size) {
  int64_t pages = int64_t(kv_indptr[b + 1]) - kv_indptr[b];
  return pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[b];
}

// Where appended token at position `pos` of request b goes: the request's page table must
// already cover it (pos < request_kv_len).
KVATTN_HD int64_t append_offset(const CacheStrides& s, const int32_t* kv_indices,
                                int64_t request_page_begin, int64_t pos, int page_size, int64_t h,
                                int64_t d) {
  PageSlot ps = locate_token(kv_indices, request_page_begin, pos, page_size);
  return s.offset(ps.page, ps.slot, h, d);
}

}  // namespace kvattn::paged

namespace kvattn {
struct Problem;
struct TensorView;
}  // namespace kvattn

namespace kvattn::paged {

// Host only (core/paged_kv.cc), for every backend's parameters: the strides by meaning of a K or V
// tensor of `problem`'s operation — a paged cache in its layout; single K / V [keys, H, D] (NHD)
// or [H, keys, D] (HND) and ragged K / V (always NHD, as in FlashInfer) with page = 0 and slot
// the token stride.
CacheStrides kv_strides(const Problem& problem, const TensorView& t);
// The per-(token, head) scale tensor's: [P, page_size, H_kv] beside a paged cache (either
// layout), [keys, H_kv] beside single or ragged K / V (page = 0); dim unused.
CacheStrides scale_strides(const Problem& problem, const TensorView& t);

}  // namespace kvattn::paged
