// append_paged_mla_kv_cache: the latent cache is a paged cache of one KV head whose "K" is ckv and
// whose "V" is kpe, both quantized with k_scale, so the append is append_paged_kv_cache's on
// rank-4 views of the same memory (one validation, one kernel per backend for both).
#include <string>

#include "core/status_macros.h"
#include "core/validate.h"
#include "kvattn/mla.h"

namespace kvattn {
namespace {

// [n, D] -> [n, 1, D] and [P, ps, D] -> [P, ps, 1, D]: a head dim of size 1 inserted before the
// last dim, same memory and buffer.
TensorView with_head_dim(const TensorView& t) {
  TensorView r = t;
  r.rank = t.rank + 1;
  r.shape[t.rank] = t.shape[t.rank - 1];
  r.strides[t.rank] = t.strides[t.rank - 1];
  r.shape[t.rank - 1] = 1;
  r.strides[t.rank - 1] = t.shape[t.rank - 1] * t.strides[t.rank - 1];
  return r;
}

// Messages of the shared validation name the arguments by their MLA names.
Status renamed(const Status& s) {
  if (s.ok()) return s;
  std::string m = s.message();
  const std::pair<std::string, std::string> names[] = {
      {"append_k", "append_ckv"},
      {"append_v", "append_kpe"},
      {"k_cache", "ckv_cache"},
      {"v_cache", "kpe_cache"},
      {"append_paged_kv_cache", "append_paged_mla_kv_cache"}};
  std::string out;
  for (std::size_t i = 0; i < m.size();) {
    bool hit = false;
    for (const auto& [from, to] : names) {
      if (m.compare(i, from.size(), from) == 0) {
        out += to;
        i += from.size();
        hit = true;
        break;
      }
    }
    if (!hit) out += m[i++];
  }
  return Status(s.code(), out);
}

}  // namespace

Status append_paged_mla_kv_cache(const TensorView& append_ckv, const TensorView& append_kpe,
                                 const TensorView& batch_indices, const TensorView& positions,
                                 const PagedMLACache& cache, const OpOptions& options) {
  KVATTN_RETURN_IF_ERROR(validate_append_paged_mla_kv_cache(append_ckv, append_kpe, cache));
  PagedKVCache kv;
  kv.k_cache = with_head_dim(cache.ckv_cache);
  kv.v_cache = with_head_dim(cache.kpe_cache);
  kv.kv_indptr = cache.kv_indptr;
  kv.kv_indices = cache.kv_indices;
  kv.kv_last_page_len = cache.kv_last_page_len;
  kv.layout = KVLayout::kNHD;
  kv.k_scale = kv.v_scale = cache.k_scale;
  return renamed(append_paged_kv_cache(with_head_dim(append_ckv), with_head_dim(append_kpe),
                                       batch_indices, positions, kv, options));
}

}  // namespace kvattn
