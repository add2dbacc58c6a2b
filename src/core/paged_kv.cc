#include "core/paged_kv.h"

#include "kvattn/problem.h"
#include "kvattn/tensor.h"

namespace kvattn::paged {

CacheStrides kv_strides(const Problem& p, const TensorView& t) {
  if (is_paged(p.op)) return cache_strides(t.strides.data(), p.kv_layout == KVLayout::kHND);
  CacheStrides s;
  const bool hnd = p.op != Op::kBatchPrefillRagged && p.kv_layout == KVLayout::kHND;
  s.slot = hnd ? t.strides[1] : t.strides[0];
  s.head = hnd ? t.strides[0] : t.strides[1];
  s.dim = t.strides[2];
  return s;
}

CacheStrides scale_strides(const Problem& p, const TensorView& t) {
  CacheStrides s;
  const int r = is_paged(p.op) ? 1 : 0;
  s.page = is_paged(p.op) ? t.strides[0] : 0;
  s.slot = t.strides[r];
  s.head = t.strides[r + 1];
  return s;
}

}  // namespace kvattn::paged
