// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): the cache maintenance that goes with
// Op::kBatchMLAPaged (attention itself runs through kvattn::plan / kvattn::run).
#pragma once

#include "kvattn/attention.h"
#include "kvattn/status.h"
#include "kvattn/tensor.h"

namespace kvattn {

// The paged latent cache as append_paged_mla_kv_cache sees it.
struct PagedMLACache {
  TensorView ckv_cache;  // [P, page_size, D_ckv]
  TensorView kpe_cache;  // [P, page_size, D_kpe]
  TensorView kv_indptr, kv_indices, kv_last_page_len;
  float k_scale = 1.0f;  // stored = round(real / k_scale) for fp8 caches (ckv and kpe alike)
};

// Writes append_ckv [nnz, D_ckv] and append_kpe [nnz, D_kpe] at (batch_indices[i], positions[i])
// of the paged latent cache, converting (for fp8 quantizing with k_scale, saturating) to the
// cache dtype. As FlashInfer's append_paged_mla_kv_cache; a batch index of kPaddedAppendRow (-1)
// marks a padded row, which writes nothing.
Status append_paged_mla_kv_cache(const TensorView& append_ckv, const TensorView& append_kpe,
                                 const TensorView& batch_indices, const TensorView& positions,
                                 const PagedMLACache& cache, const OpOptions& options = {});

}  // namespace kvattn
