// append_paged_kv_cache of the cpu backend (converting, fp8 quantizing with saturation; the
// reference's semantics, fp64 arithmetic: see row_io.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/numeric.h"
#include "core/paged_kv.h"
#include "core/status_macros.h"
#include "cpu/ops/ops.h"
#include "cpu/ops/row_io.h"

namespace kvattn::cpu {

using namespace ops;

Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& cache, int num_threads) {
  const int64_t nnz = append_k.shape[0];
  const int64_t batch = cache.kv_indptr.shape[0] - 1;
  const int64_t num_pages = cache.k_cache.shape[0];
  const bool nhd = cache.layout == KVLayout::kNHD;
  const int64_t page_size = nhd ? cache.k_cache.shape[1] : cache.k_cache.shape[2];
  // Where each entry goes, checked up front so that a bad entry writes nothing at all.
  std::vector<int64_t> page_of(nnz), slot_of(nnz);
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t b = load_i32(batch_indices, i);
    if (b == kPaddedAppendRow) {  // a padded row writes nothing
      page_of[i] = -1;
      continue;
    }
    const int64_t pos = load_i32(positions, i);
    if (b < 0 || b >= batch || pos < 0) {
      return make_error(ErrorCode::kInvalidArgument, "append_paged_kv_cache: entry ", i,
                        " has batch index ", b, " and position ", pos, " outside the batch");
    }
    const int64_t page_begin = load_i32(cache.kv_indptr, b);
    const int64_t page_end = load_i32(cache.kv_indptr, b + 1);
    if (page_begin + pos / page_size >= page_end) {
      return make_error(ErrorCode::kInvalidArgument, "append_paged_kv_cache: position ", pos,
                        " of request ", b, " is past its ", page_end - page_begin, " pages");
    }
    // (paged::locate_token's arithmetic; the page table may be a strided view here.)
    const paged::PageSlot where{load_i32(cache.kv_indices, page_begin + pos / page_size),
                                pos % page_size};
    if (where.page < 0 || where.page >= num_pages) {
      return make_error(ErrorCode::kInvalidPageTable, "append_paged_kv_cache: page id ",
                        where.page, " is outside [0, ", num_pages, ")");
    }
    page_of[i] = where.page;
    slot_of[i] = where.slot;
  }
  const bool per_token = cache.scale_granularity == KVScaleGranularity::kPerTokenHead;
  const bool e5m2 = cache.k_cache.dtype == DType::kE5M2;
  auto write = [&](const TensorView& src, const TensorView& dst, const TensorView& scales,
                   double per_tensor, int64_t i) {
    const int64_t heads = src.shape[1], dim = src.shape[2];
    const paged::CacheStrides strides = paged::cache_strides(dst.strides.data(), !nhd);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = strides.offset(page_of[i], slot_of[i], h, 0);
      double scale = per_tensor;
      if (per_token) {
        // The row's scale (DESIGN.md §2), stored beside it at the same (page, slot, head).
        double amax = 0.0;
        for (int64_t d = 0; d < dim; ++d) {
          amax = std::max(amax, std::abs(static_cast<double>(load(src, at(src, i, h, d)))));
        }
        const float stored = num::per_token_fp8_scale(amax, e5m2);
        scales.as<float>()[at(scales, page_of[i], slot_of[i], h)] = stored;
        scale = stored;
      }
      for (int64_t d = 0; d < dim; ++d) {
        store(dst, base + d * strides.dim, load(src, at(src, i, h, d)) / scale);
      }
    }
  };
  for_rows(num_threads, nnz, [&](int64_t i) {
    if (page_of[i] < 0) return;  // padded
    write(append_k, cache.k_cache, cache.k_scale_cache, cache.k_scale, i);
    write(append_v, cache.v_cache, cache.v_scale_cache, cache.v_scale, i);
  });
  return Status::Ok();
}

}  // namespace kvattn::cpu
