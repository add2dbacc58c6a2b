// fa2's kernel parameters from a problem, its tensors and the schedule (host code, no CUDA):
// launch.cu adds the device workspace's pointers; tests/cuda/fa2/cta_replay_test.cc runs the kernel
// body on the CPU with the same parameters over host tensors.
#include "cuda/fa2/kernel_params.h"

#include <cstdint>

#include "core/run_scalars.h"
#include "core/status_macros.h"

namespace kvattn::fa2 {
namespace {

// K/V rows can be copied 16 bytes at a time when the dim is dense and every row start is
// 16-byte aligned.
bool rows_are_vector_aligned(const TensorView& t, const paged::CacheStrides& s) {
  const int64_t elem = int64_t(dtype_size(t.dtype));
  const auto aligned = [&](int64_t stride) { return (stride * elem) % 16 == 0; };
  return s.dim == 1 && aligned(s.page) && aligned(s.slot) && aligned(s.head) &&
         reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

// Dims d, d + 1 (d even) of every output row form one aligned pair: o dense in the dim, row and
// head strides even, the pointer aligned to the pair.
bool output_pairs_aligned(const TensorView& out, const AttentionParams& k) {
  const std::size_t pair = 2 * dtype_size(out.dtype);
  return k.o_stride_dim == 1 && k.o_stride_row % 2 == 0 && k.o_stride_head % 2 == 0 &&
         reinterpret_cast<uintptr_t>(out.data) % pair == 0;
}

}  // namespace

Status make_kernel_params(const Problem& p, const AttentionArgs& args, const Schedule& s,
                          AttentionParams* out) {
  AttentionParams& k = *out;
  k = AttentionParams{};
  const bool single_decode = p.op == Op::kSingleDecode;
  k.q = args.q.data;
  k.q_stride_row = single_decode ? 0 : args.q.strides[0];
  k.q_stride_head = single_decode ? args.q.strides[0] : args.q.strides[1];
  k.q_stride_dim = single_decode ? args.q.strides[1] : args.q.strides[2];
  const TensorView& kt = is_paged(p.op) ? args.paged_k_cache : args.k;
  const TensorView& vt = is_paged(p.op) ? args.paged_v_cache : args.v;
  k.k = kt.data;
  k.v = vt.data;
  k.k_strides = kv_strides(p, kt);
  k.v_strides = kv_strides(p, vt);
  k.paged = is_paged(p.op);
  k.page_size = p.page_size;
  k.page_div = cuda::FastDiv(uint32_t(p.page_size > 0 ? p.page_size : 1));
  k.kv_vector_loads =
      rows_are_vector_aligned(kt, k.k_strides) && rows_are_vector_aligned(vt, k.v_strides);
  k.out = args.out.data;
  k.o_stride_row = single_decode ? 0 : args.out.strides[0];
  k.o_stride_head = single_decode ? args.out.strides[0] : args.out.strides[1];
  k.o_stride_dim = single_decode ? args.out.strides[1] : args.out.strides[2];
  k.out_kind = cuda::out_kind(p.o_dtype);
  k.out_pairs = output_pairs_aligned(args.out, k);
  if (!args.lse.empty()) {
    k.lse = static_cast<float*>(args.lse.data);
    k.lse_scale = lse_store_scale(args.scalars);
    k.lse_stride_row = single_decode ? 0 : args.lse.strides[0];
    k.lse_stride_head = single_decode ? args.lse.strides[0] : args.lse.strides[1];
  }
  k.chunk_size = s.chunk_size;
  k.num_qo_heads = p.num_qo_heads;
  k.num_kv_heads = p.num_kv_heads;
  k.group = p.group_size();
  k.score_scale = p.effective_sm_scale() * args.scalars.q_scale * args.scalars.k_scale;
  k.v_scale = args.scalars.v_scale;
  k.soft_cap = p.logits_soft_cap;
  k.causal = p.mask_mode == MaskMode::kCausal;
  k.window_left = p.window_left;
  if (p.mask_mode == MaskMode::kCustom) {
    if (args.custom_mask.strides[0] != 1) {
      return make_error(ErrorCode::kInvalidArgument, "fa2: custom_mask must be contiguous (stride ",
                        args.custom_mask.strides[0], ")");
    }
    k.custom_mask = static_cast<const uint8_t*>(args.custom_mask.data);
    k.custom_mask_packed = args.custom_mask_packed;
  }
  k.alibi = p.pos_encoding_mode == PosEncoding::kAlibi;
  if (k.alibi && !args.alibi_slopes.empty()) {
    k.alibi_slopes = static_cast<const float*>(args.alibi_slopes.data);
    k.alibi_stride = args.alibi_slopes.strides[0];
  }
  if (!args.sinks.empty()) {
    k.sinks = static_cast<const float*>(args.sinks.data);
    k.sinks_stride = args.sinks.strides[0];
  }
  // Per-head scales: a per_head plan's, or this layer's on a per_tensor plan.
  if (!args.k_scale.empty()) {
    k.k_head_scale = static_cast<const float*>(args.k_scale.data);
    k.v_head_scale = static_cast<const float*>(args.v_scale.data);
    k.k_head_scale_stride = args.k_scale.strides[0];
    k.v_head_scale_stride = args.v_scale.strides[0];
  }
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    k.k_scale_cache = static_cast<const float*>(args.k_scale_cache.data);
    k.v_scale_cache = static_cast<const float*>(args.v_scale_cache.data);
    k.ks_strides = paged::scale_strides(p, args.k_scale_cache);
    k.vs_strides = paged::scale_strides(p, args.v_scale_cache);
  }
  k.rope = p.pos_encoding_mode == PosEncoding::kRopeLlama;
  k.rope_theta = p.rope_theta;
  k.rope_scale = p.rope_scale;
  k.rope_interleave = p.rope_interleave;

  return Status::Ok();
}

}  // namespace kvattn::fa2
