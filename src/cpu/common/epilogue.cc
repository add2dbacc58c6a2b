#include "cpu/common/epilogue.h"

#include <cstring>
#include <limits>

#include "core/numeric.h"
#include "core/run_scalars.h"

namespace kvattn::cpu {

math::RowFinish finish_row(float m, float sum, float v_scale, bool nan_row, const float* sink) {
  if (nan_row) {
    constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
    return math::RowFinish{kNan, kNan};
  }
  return sink ? math::finish_row_with_sink(m, sum, v_scale, *sink)
              : math::finish_row(m, sum, v_scale);
}

namespace {

// 16-bit stores, one loop per dtype: unit-stride rows through a staging buffer in loops the
// compiler vectorizes (a per-element dtype test or stride kept them scalar: ~10 % of a
// DeepSeek-V3 MLA decode step once).
template <uint16_t (*kConvert)(float)>
void store_16bit(const float* src, int n, unsigned char* o, int64_t stride) {
  if (stride == 1) {
    constexpr int kChunk = 256;
    uint16_t staged[kChunk];
    for (int at = 0; at < n; at += kChunk) {
      const int m = n - at < kChunk ? n - at : kChunk;
      for (int d = 0; d < m; ++d) staged[d] = kConvert(src[at + d]);
      std::memcpy(o + 2 * int64_t{at}, staged, 2 * static_cast<std::size_t>(m));
    }
    return;
  }
  for (int d = 0; d < n; ++d) {
    const uint16_t h = kConvert(src[d]);
    std::memcpy(o + d * stride * 2, &h, 2);
  }
}

// f32 values src[0, n) stored as `dtype` (f32, f16 or bf16: the cpu backend's output dtypes) at
// dst, element stride `stride`; dst need not be aligned.
void store_row(const float* src, int n, DType dtype, void* dst, int64_t stride) {
  auto* o = static_cast<unsigned char*>(dst);
  if (dtype == DType::kF32) {
    if (stride == 1) {
      std::memcpy(o, src, sizeof(float) * n);
    } else {
      for (int d = 0; d < n; ++d) std::memcpy(o + d * stride * 4, src + d, 4);
    }
  } else if (dtype == DType::kBF16) {
    store_16bit<num::f32_to_bf16>(src, n, o, stride);
  } else {
    store_16bit<num::f32_to_f16>(src, n, o, stride);
  }
}

}  // namespace

OutputRows OutputRows::of(const AttentionArgs& args) {
  OutputRows r;
  const TensorView& o = args.out;
  const bool one_token = o.rank == 2;
  r.out = static_cast<std::byte*>(o.data);
  r.dtype = o.dtype;
  r.stride_token = one_token ? 0 : o.strides[0];
  r.stride_head = o.strides[one_token ? 0 : 1];
  r.stride_dim = o.strides[one_token ? 1 : 2];
  if (!args.lse.empty()) {
    const TensorView& l = args.lse;
    r.lse = static_cast<float*>(l.data);
    r.lse_scale = lse_store_scale(args.scalars);
    r.lse_stride_token = l.rank == 1 ? 0 : l.strides[0];
    r.lse_stride_head = l.strides[l.rank == 1 ? 0 : 1];
  }
  return r;
}

void OutputRows::store(int64_t token, int head, const float* row, int dim, float lse_value) const {
  store_row(row, dim, dtype, row_at(token, head), stride_dim);
  store_lse(token, head, lse_value);
}

void OutputRows::store_lse(int64_t token, int head, float lse_value) const {
  if (lse) lse[token * lse_stride_token + head * lse_stride_head] = lse_value * lse_scale;
}

}  // namespace kvattn::cpu
