// The building blocks of validation (validate.h): checks of one tensor view, of byte ranges, and
// of CSR indptrs and page tables. Every check names the argument, the value and the rule, and
// none touches the memory of a view before that view has been proven to lie inside its buffer.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "kvattn/status.h"
#include "kvattn/tensor.h"

namespace kvattn::validation {

// Checked int64 arithmetic: false when the exact result does not fit.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool checked_add(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// Which memory a view may live in. Index tensors are read by validation itself, so they must be
// host memory; data tensors must all live with the first data tensor.
enum class Residence { kHostOnly, kAny };

// The rules every given view obeys on its own: rank in [1, kMaxRank], a known dtype and memory
// kind, dims >= 0, strides >= 0, a non-null pointer when it has elements, buffer_bytes >= 0, and
// its reachable byte extent computed without overflow, inside buffer_bytes and not wrapping the
// address space.
Status check_view(const TensorView& t, std::string_view name);

// A required argument: given (not empty), then check_view.
Status check_given(const TensorView& t, std::string_view name, std::string_view op);
// An argument the operation does not read must stay empty (never a silently ignored input).
Status check_unused(const TensorView& t, std::string_view name, std::string_view op);

Status check_dtype(const TensorView& t, std::string_view name, DType expected);
Status check_host(const TensorView& t, std::string_view name);
// `t` must live in the same memory (kind and device index) as `ref`.
Status check_same_memory(const TensorView& t, std::string_view name, const TensorView& ref,
                         std::string_view ref_name);

// One expected dimension: `size` < 0 accepts any size; `meaning` names where the size comes from
// ("num_qo_heads", "qo_indptr[B]").
struct DimRule {
  int64_t size;
  std::string_view meaning;
};
// Rank and dims. `layout` spells the expected shape for the rank message ("[B, H_qo, D_qk]").
Status check_shape(const TensorView& t, std::string_view name, std::string_view layout,
                   std::initializer_list<DimRule> dims);

// Bytes from t.data to one past the last reachable byte (0 for a view without elements). Only
// meaningful after check_view succeeded.
int64_t reachable_bytes(const TensorView& t);
// Whether two checked views share a byte of an element (views in different memories never do).
// Element-exact for strided views (the split views of one packed qkv tensor interleave without
// sharing a byte); a pair too large to decide within a fixed budget, where neither view is free
// of self-interleaving, is judged by its byte ranges (refused, never missed).
bool overlaps(const TensorView& a, const TensorView& b);
// kAliasing when output `out` overlaps input `in`.
Status check_no_overlap(const TensorView& out, std::string_view out_name, const TensorView& in,
                        std::string_view in_name);

// An output whose strides map two of its elements to one address (a dimension of size > 1 with
// stride 0, or strides that interleave) is refused with kAliasing: writes would race.
Status check_output_layout(const TensorView& t, std::string_view name);

// Element i of a checked rank-1 i32 host view.
inline int32_t index_at(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

// A rank-1 i32 host index tensor of `length` elements (length < 0: any).
Status check_index_tensor(const TensorView& t, std::string_view name, std::string_view op,
                          int64_t length, std::string_view length_meaning);

// A CSR indptr of batch + 1 entries: indptr[0] == 0, non-decreasing. `total` = indptr[batch].
Status check_indptr(const TensorView& indptr, std::string_view name, int64_t batch, int64_t* total);

// The paged KV page table: kv_indptr as check_indptr, kv_indptr[B] <= kv_indices length, every
// used page id in [0, num_pages), kv_last_page_len[b] in [1, page_size] for requests with pages.
// The three views must have passed check_index_tensor.
Status check_page_table(const TensorView& kv_indptr, const TensorView& kv_indices,
                        const TensorView& kv_last_page_len, int64_t batch, int64_t num_pages,
                        int64_t page_size);

// Tokens of request b of a checked page table.
inline int64_t paged_kv_len(const TensorView& kv_indptr, const TensorView& kv_last_page_len,
                            int64_t b, int64_t page_size) {
  const int64_t pages = int64_t{index_at(kv_indptr, b + 1)} - index_at(kv_indptr, b);
  return pages == 0 ? 0 : (pages - 1) * page_size + index_at(kv_last_page_len, b);
}

}  // namespace kvattn::validation
