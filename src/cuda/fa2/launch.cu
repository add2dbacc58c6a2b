// fa2's attention on the host side of CUDA: finds the kernel in the generated table, builds the
// kernel parameters from the plan and the tensors, copies the schedule to the device, launches,
// and merges the split-KV partial states.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/attention_math.h"
#include "cuda/common/device_buffer.h"
#include "cuda/fa2/kernel_table.h"
#include "cuda/fa2/kernels/store_out.cuh"
#include "cuda/fa2/launch.h"
#include "cuda/fa2/schedule.h"

namespace kvattn::fa2 {
namespace {

// Combines the partial states of one query row (one CTA per MergeRow): each thread owns output
// dims, every head in turn; the weights come from the per-chunk lse.
__global__ void merge_partials_kernel(const MergeRow* rows, const float* partial_o,
                                      const float* partial_lse, int num_heads, int head_dim,
                                      AttentionParams p) {
  const MergeRow row = rows[blockIdx.x];
  for (int h = 0; h < num_heads; ++h) {
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
      math::StateMerger merger;
      float o = 0.0f;
      // The sink joins once, here, as a state with no value (the partials exclude it).
      if (p.sinks) {
        float scale_acc = 0.0f, scale_c = 0.0f;
        merger.add(p.sinks[h * p.sinks_stride], &scale_acc, &scale_c);
      }
      for (int64_t c = 0; c < row.chunks; ++c) {
        const int64_t state = row.first_state + c;
        const float lse = partial_lse[state * num_heads + h];
        if (lse == -INFINITY) continue;  // a chunk with no visible key adds nothing
        float scale_acc = 0.0f, scale_c = 0.0f;
        merger.add(lse, &scale_acc, &scale_c);
        o = o * scale_acc + partial_o[(state * num_heads + h) * head_dim + d] * scale_c;
      }
      o *= merger.inv_sum();
      const int64_t off = row.out_row * p.o_stride_row + h * p.o_stride_head + d * p.o_stride_dim;
      store_out(p, off, o);
      if (p.lse && d == 0)
        p.lse[row.out_row * p.lse_stride_row + h * p.lse_stride_head] = merger.lse();
    }
  }
}

const KernelEntry* find_kernel(const KernelKey& key) {
  for (const KernelEntry& e : kKernelTable) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

Status expect_memory(const TensorView& t, MemoryKind kind, const char* name) {
  if (t.empty() || t.memory == kind) return Status::Ok();
  return make_error(ErrorCode::kInvalidArgument, "fa2: ", name, " must be in ",
                    kind == MemoryKind::kCuda ? "CUDA device" : "host", " memory");
}

OutKind out_kind(DType d) {
  return d == DType::kF32 ? OutKind::kF32 : d == DType::kF16 ? OutKind::kF16 : OutKind::kBF16;
}

// K/V rows can be copied 16 bytes at a time when the dim is dense and every row start is
// 16-byte aligned.
bool rows_are_vector_aligned(const TensorView& t, const paged::CacheStrides& s) {
  const int64_t elem = int64_t(dtype_size(t.dtype));
  const auto aligned = [&](int64_t stride) { return (stride * elem) % 16 == 0; };
  return s.dim == 1 && aligned(s.page) && aligned(s.slot) && aligned(s.head) &&
         reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

// K / V strides by meaning, for every operation's layout.
paged::CacheStrides kv_strides(const Problem& p, const TensorView& t) {
  if (is_paged(p.op)) return paged::cache_strides(t.strides.data(), p.kv_layout == KVLayout::kHND);
  paged::CacheStrides s;
  const bool hnd = p.op != Op::kBatchPrefillRagged && p.kv_layout == KVLayout::kHND;
  s.slot = hnd ? t.strides[1] : t.strides[0];
  s.head = hnd ? t.strides[0] : t.strides[1];
  s.dim = t.strides[2];
  return s;
}

Status check_memory(const Problem& p, const AttentionArgs& a) {
  const MemoryKind dev = MemoryKind::kCuda, host = MemoryKind::kHost;
  KVATTN_RETURN_IF_ERROR(expect_memory(a.q, dev, "q"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.out, dev, "out"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.lse, dev, "lse"));
  if (is_paged(p.op)) {
    KVATTN_RETURN_IF_ERROR(expect_memory(a.paged_k_cache, dev, "paged_k_cache"));
    KVATTN_RETURN_IF_ERROR(expect_memory(a.paged_v_cache, dev, "paged_v_cache"));
  } else {
    KVATTN_RETURN_IF_ERROR(expect_memory(a.k, dev, "k"));
    KVATTN_RETURN_IF_ERROR(expect_memory(a.v, dev, "v"));
  }
  KVATTN_RETURN_IF_ERROR(expect_memory(a.custom_mask, dev, "custom_mask"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.alibi_slopes, dev, "alibi_slopes"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.sinks, dev, "sinks"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.k_scale, dev, "k_scale"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.v_scale, dev, "v_scale"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.k_scale_cache, dev, "k_scale_cache"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.v_scale_cache, dev, "v_scale_cache"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.qo_indptr, host, "qo_indptr"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.kv_indptr, host, "kv_indptr"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.kv_indices, host, "kv_indices"));
  return expect_memory(a.kv_last_page_len, host, "kv_last_page_len");
}

std::vector<int32_t> read_indices(const TensorView& t) {
  std::vector<int32_t> v(t.rank == 1 ? size_t(t.shape[0]) : 0);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<const int32_t*>(t.data)[i * t.strides[0]];
  return v;
}

}  // namespace

int device_sm_count(int index) {
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

Status run_attention(const Plan& plan, const AttentionArgs& args) {
  const Problem& p = plan.problem;
  const KernelEntry* kernel = find_kernel(kernel_key(p));
  if (!kernel) {
    return make_error(ErrorCode::kUnavailable, "fa2: no kernel built for ",
                      kernel_key_string(kernel_key(p)));
  }
  KVATTN_RETURN_IF_ERROR(check_memory(p, args));
  KVATTN_RETURN_IF_ERROR(cuda::cuda_status("cudaSetDevice", cudaSetDevice(plan.device.index)));

  const Schedule s = make_schedule(
      p, plan.qo_len, plan.kv_len, request_starts(p, args), args.custom_mask_packed,
      plan.kv_chunk_size > 0 ? plan.kv_chunk_size : -1, device_sm_count(plan.device.index));
  if (s.work.empty()) return Status::Ok();

  AttentionParams k;
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
  k.kv_vector_loads =
      rows_are_vector_aligned(kt, k.k_strides) && rows_are_vector_aligned(vt, k.v_strides);
  k.out = args.out.data;
  k.o_stride_row = single_decode ? 0 : args.out.strides[0];
  k.o_stride_head = single_decode ? args.out.strides[0] : args.out.strides[1];
  k.o_stride_dim = single_decode ? args.out.strides[1] : args.out.strides[2];
  k.out_kind = out_kind(p.o_dtype);
  if (p.return_lse && !args.lse.empty()) {
    k.lse = static_cast<float*>(args.lse.data);
    k.lse_stride_row = single_decode ? 0 : args.lse.strides[0];
    k.lse_stride_head = single_decode ? args.lse.strides[0] : args.lse.strides[1];
  }
  k.chunk_size = s.chunk_size;
  k.num_qo_heads = p.num_qo_heads;
  k.num_kv_heads = p.num_kv_heads;
  k.group = p.group_size();
  k.score_scale = p.effective_sm_scale() * p.q_scale * p.k_scale;
  k.v_scale = p.v_scale;
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
  if (p.use_sinks) {
    k.sinks = static_cast<const float*>(args.sinks.data);
    k.sinks_stride = args.sinks.strides[0];
  }
  if (p.kv_scale_granularity == KVScaleGranularity::kPerHead) {
    k.k_head_scale = static_cast<const float*>(args.k_scale.data);
    k.v_head_scale = static_cast<const float*>(args.v_scale.data);
    k.k_head_scale_stride = args.k_scale.strides[0];
    k.v_head_scale_stride = args.v_scale.strides[0];
  }
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    // [P, page_size, H_kv] beside a paged cache (either layout), [keys, H_kv] otherwise.
    auto scale_strides = [&](const TensorView& t) {
      paged::CacheStrides s;
      const int r = is_paged(p.op) ? 1 : 0;
      s.page = is_paged(p.op) ? t.strides[0] : 0;
      s.slot = t.strides[r];
      s.head = t.strides[r + 1];
      return s;
    };
    k.k_scale_cache = static_cast<const float*>(args.k_scale_cache.data);
    k.v_scale_cache = static_cast<const float*>(args.v_scale_cache.data);
    k.ks_strides = scale_strides(args.k_scale_cache);
    k.vs_strides = scale_strides(args.v_scale_cache);
  }
  k.rope = p.pos_encoding_mode == PosEncoding::kRopeLlama;
  k.rope_theta = p.rope_theta;
  k.rope_scale = p.rope_scale;
  k.rope_interleave = p.rope_interleave;

  cuda::DeviceBuffer requests, work, indices, partial_o, partial_lse, merge_rows;
  KVATTN_RETURN_IF_ERROR(requests.upload(s.requests));
  KVATTN_RETURN_IF_ERROR(work.upload(s.work));
  if (k.paged) {
    KVATTN_RETURN_IF_ERROR(indices.upload(read_indices(args.kv_indices)));
    k.kv_indices = indices.as<int32_t>();
  }
  k.requests = requests.as<RequestInfo>();
  k.work = work.as<WorkUnit>();
  if (s.num_partial_states > 0) {
    const std::size_t states = std::size_t(s.num_partial_states) * p.num_qo_heads;
    KVATTN_RETURN_IF_ERROR(partial_o.allocate(states * p.head_dim_vo * sizeof(float)));
    KVATTN_RETURN_IF_ERROR(partial_lse.allocate(states * sizeof(float)));
    KVATTN_RETURN_IF_ERROR(merge_rows.upload(s.merge_rows));
    k.partial_o = partial_o.as<float>();
    k.partial_lse = partial_lse.as<float>();
  }

  const int err = kernel->launch(k, int(s.work.size()), s.warps, nullptr);
  KVATTN_RETURN_IF_ERROR(cuda::cuda_status("fa2 attention kernel", cudaError_t(err)));
  if (!s.merge_rows.empty()) {
    merge_partials_kernel<<<int(s.merge_rows.size()), 128>>>(
        merge_rows.as<MergeRow>(), k.partial_o, k.partial_lse, p.num_qo_heads, p.head_dim_vo, k);
    KVATTN_RETURN_IF_ERROR(cuda::cuda_status("fa2 merge kernel", cudaGetLastError()));
  }
  return Status::Ok();
}

}  // namespace kvattn::fa2
