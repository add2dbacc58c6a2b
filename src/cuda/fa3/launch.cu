// fa3's attention (prefill and decode) on the host side of CUDA: finds the kernel in the
// generated table, makes the parameters, tile list and split plan (kernel_params.h, with the
// driver's TMA encoder), copies them to the device, launches one persistent CTA per SM (at most
// one per tile), then the merge of the split requests' partial states.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/common/device_buffer.h"
#include "cuda/fa3/kernel_params.h"
#include "cuda/fa3/kernel_table.h"
#include "cuda/fa3/launch.h"

namespace kvattn::fa3 {
namespace {

const KernelEntry* find_kernel(const KernelKey& key) {
  for (const KernelEntry& e : kKernelTable) {
    if (e.launch && e.key == key) return &e;
  }
  return nullptr;
}

Status expect_memory(const TensorView& t, MemoryKind kind, const char* name) {
  if (t.empty() || t.memory == kind) return Status::Ok();
  return make_error(ErrorCode::kInvalidArgument, "fa3: ", name, " must be in ",
                    kind == MemoryKind::kCuda ? "CUDA device" : "host", " memory");
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
  KVATTN_RETURN_IF_ERROR(expect_memory(a.qo_indptr, host, "qo_indptr"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.kv_indptr, host, "kv_indptr"));
  KVATTN_RETURN_IF_ERROR(expect_memory(a.kv_indices, host, "kv_indices"));
  return expect_memory(a.kv_last_page_len, host, "kv_last_page_len");
}

int sm_count(int index) {
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// The driver's tensor-map encoder, reached through the runtime (no link against libcuda); null
// when the driver does not give it.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encoder() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// A TMA map through the driver (kernel_params.h's KvMapSpec).
bool encode_kv_map(CUtensorMap* map, const KvMapSpec& m) {
  const EncodeTiled encode = encoder();
  if (!encode) return false;
  const cuuint64_t dims[4] = {m.dims[0], m.dims[1], m.dims[2], m.dims[3]};
  const cuuint64_t strides[3] = {m.strides[0], m.strides[1], m.strides[2]};
  const cuuint32_t box[4] = {m.box[0], m.box[1], m.box[2], m.box[3]};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  // FP8 K/V as bytes (TMA copies them; no FP8 tensor-map type is needed to move them).
  const CUtensorMapDataType type = m.dtype == DType::kBF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : m.dtype == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  return encode(map, type, 4, const_cast<void*>(m.data), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

Status run_attention(const Plan& plan, const AttentionArgs& args) {
  const Problem& p = plan.problem;
  const KernelEntry* kernel = find_kernel(kernel_key(p));
  if (!kernel) {
    return make_error(ErrorCode::kUnavailable, "fa3: no kernel built for ",
                      kernel_key_string(kernel_key(p)));
  }
  KVATTN_RETURN_IF_ERROR(check_memory(p, args));
  KVATTN_RETURN_IF_ERROR(cuda::cuda_status("cudaSetDevice", cudaSetDevice(plan.device.index)));

  KernelInputs in;
  KVATTN_RETURN_IF_ERROR(make_kernel_inputs(plan, args, encode_kv_map, &in));
  PrefillParams& k = in.params;
  const split_kv::SplitPlan& split = in.split;
  if (in.tiles.empty()) return Status::Ok();

  cuda::DeviceBuffer requests_dev, tiles_dev, indices_dev, partial_o, partial_lse, merge_rows;
  KVATTN_RETURN_IF_ERROR(requests_dev.upload(in.requests));
  KVATTN_RETURN_IF_ERROR(tiles_dev.upload(in.tiles));
  if (k.paged) {
    KVATTN_RETURN_IF_ERROR(indices_dev.upload(in.kv_indices));
    k.kv_indices = indices_dev.as<int32_t>();
  }
  if (split.num_states > 0) {
    const std::size_t states = std::size_t(split.num_states) * std::size_t(p.num_qo_heads);
    KVATTN_RETURN_IF_ERROR(partial_o.allocate(states * std::size_t(p.head_dim_vo) * sizeof(float)));
    KVATTN_RETURN_IF_ERROR(partial_lse.allocate(states * sizeof(float)));
    KVATTN_RETURN_IF_ERROR(merge_rows.upload(split.merge_rows));
    k.partial_o = partial_o.as<float>();
    k.partial_lse = partial_lse.as<float>();
  }
  k.requests = requests_dev.as<RequestInfo>();
  k.tiles = tiles_dev.as<sched::Tile>();
  const int sms = std::max(1, sm_count(plan.device.index));
  const int err = kernel->launch(k, std::min(sms, k.num_tiles), nullptr);
  KVATTN_RETURN_IF_ERROR(cuda::cuda_status("fa3 attention kernel", cudaError_t(err)));
  if (!split.merge_rows.empty()) {
    // The split-KV merge (cuda/common/split_merge.h, fa2's too): a CTA per (row, query head).
    cuda::MergeParams m = merge_params(k, merge_rows.as<split_kv::MergeRow>(), split, p);
    const cuda::MergeGrid g = cuda::merge_grid(m);
    void* merge_args[] = {&m};
    KVATTN_RETURN_IF_ERROR(cuda::cuda_status(
        "fa3 merge kernel", cudaLaunchKernel(cuda::split_merge_kernel(), dim3(g.rows, g.heads),
                                             dim3(g.threads), merge_args, 0, nullptr)));
  }
  return Status::Ok();
}

int device_sm_count(int index) { return sm_count(index); }

}  // namespace kvattn::fa3
