// fa3's attention (prefill and decode) on the host side of CUDA: finds the kernel in the
// generated table, checks what the kernel's copies need (a dense head dim, 16-byte aligned rows),
// builds the parameters (with TMA maps for dense and ragged K/V), the split-KV plan of the plan's
// chunk (split_plan.h) and the longest-first tile list (decode: GQA rows packed), copies them to
// the device, launches one persistent CTA per SM (at most one per tile), then the merge of the
// split requests' partial states.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/common/device_buffer.h"
#include "cuda/common/problem_layout.h"
#include "cuda/fa3/kernel_table.h"
#include "cuda/fa3/kernels/merge.cuh"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tma_coords.h"
#include "cuda/fa3/launch.h"
#include "cuda/fa3/split_plan.h"
#include "cuda/fa3/tile_order.h"

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

// The kernel copies rows 16 bytes at a time: the dim must be dense and every row start aligned.
Status check_rows(const char* name, const TensorView& t, std::initializer_list<int64_t> strides,
                  int64_t dim_stride) {
  const int64_t elem = int64_t(dtype_size(t.dtype));
  bool ok = dim_stride == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int64_t s : strides) ok = ok && (s * elem) % 16 == 0;
  if (ok) return Status::Ok();
  return make_error(ErrorCode::kNotSupported, "fa3: ", name,
                    " needs a dense head dim and 16-byte aligned rows (strides multiples of 16 "
                    "bytes)");
}

std::vector<int32_t> read_indices(const TensorView& t) {
  std::vector<int32_t> v(t.rank == 1 ? size_t(t.shape[0]) : 0);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<const int32_t*>(t.data)[i * t.strides[0]];
  return v;
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

// A TMA map over dense K or V [tokens, H_kv, D] with strides `s` (elements): dims D, H_kv, tokens
// (innermost first), box 64 x 1 x kBlockN, 128-byte swizzle; out-of-range elements read as zero.
bool encode_kv_map(CUtensorMap* map, DType dtype, const void* data, int64_t tokens, int heads,
                   int head_dim, int block_n_head_dim, const paged::CacheStrides& s) {
  const EncodeTiled encode = encoder();
  if (!encode || tokens <= 0) return false;
  const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(tokens)};
  const cuuint64_t strides[2] = {cuuint64_t(s.head * 2), cuuint64_t(s.slot * 2)};
  const cuuint32_t box[3] = {cuuint32_t(smem::kPanelCols16), 1,
                             cuuint32_t(sched::block_n_for(block_n_head_dim))};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map,
                dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                3, const_cast<void*>(data), dims, strides, box, elem_strides,
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

  const TensorView& kt = is_paged(p.op) ? args.paged_k_cache : args.k;
  const TensorView& vt = is_paged(p.op) ? args.paged_v_cache : args.v;
  PrefillParams k;
  // Single decode: q [H_qo, D_qk], out [H_qo, D_vo], lse [H_qo] (one token, row stride 0).
  const bool single_decode = p.op == Op::kSingleDecode;
  const int dim_axis = single_decode ? 1 : 2;
  k.q = args.q.data;
  k.q_stride_row = single_decode ? 0 : args.q.strides[0];
  k.q_stride_head = args.q.strides[dim_axis - 1];
  KVATTN_RETURN_IF_ERROR(
      check_rows("q", args.q, {k.q_stride_row, k.q_stride_head}, args.q.strides[dim_axis]));
  k.k = kt.data;
  k.v = vt.data;
  k.k_strides = cuda::kv_strides(p, kt);
  k.v_strides = cuda::kv_strides(p, vt);
  KVATTN_RETURN_IF_ERROR(
      check_rows("k", kt, {k.k_strides.page, k.k_strides.slot, k.k_strides.head}, k.k_strides.dim));
  KVATTN_RETURN_IF_ERROR(
      check_rows("v", vt, {k.v_strides.page, k.v_strides.slot, k.v_strides.head}, k.v_strides.dim));
  k.paged = is_paged(p.op);
  k.page_size = p.page_size;
  if (!k.paged && is_16bit_float(p.kv_dtype)) {
    // Dense and ragged 16-bit K/V go through TMA (FP8 V is transposed by the producer's
    // threads); the token dim is the one with the slot stride.
    const bool hnd = p.op != Op::kBatchPrefillRagged && p.kv_layout == KVLayout::kHND;
    const int64_t tokens = hnd ? kt.shape[1] : kt.shape[0];
    // Past 2^31 - 1 tokens a box's token coordinate would wrap: cp.async copies them instead.
    k.tma = tma_token_coordinates_fit(tokens) &&
            encode_kv_map(&k.tma_k, p.kv_dtype, kt.data, tokens, p.num_kv_heads, p.head_dim_qk,
                          p.head_dim_qk, k.k_strides) &&
            encode_kv_map(&k.tma_v, p.kv_dtype, vt.data, tokens, p.num_kv_heads, p.head_dim_vo,
                          p.head_dim_qk, k.v_strides);
  }
  k.out = args.out.data;
  k.o_stride_row = single_decode ? 0 : args.out.strides[0];
  k.o_stride_head = args.out.strides[dim_axis - 1];
  if (args.out.strides[dim_axis] != 1) {
    return make_error(ErrorCode::kNotSupported,
                      "fa3: out needs a dense head dim; fa2 runs any "
                      "strides");
  }
  k.out_kind = cuda::out_kind(p.o_dtype);
  if (p.return_lse && !args.lse.empty()) {
    k.lse = static_cast<float*>(args.lse.data);
    k.lse_stride_row = single_decode ? 0 : args.lse.strides[0];
    k.lse_stride_head = args.lse.strides[single_decode ? 0 : 1];
  }
  k.group = p.group_size();
  k.num_qo_heads = p.num_qo_heads;
  k.rows_per_token = pack::rows_per_token(is_decode(p.op), k.group);
  const double score_scale = double(p.effective_sm_scale()) * p.q_scale * p.k_scale;
  k.score_scale_log2 = float(score_scale * M_LOG2E);
  if (p.logits_soft_cap > 0) {
    k.soft_cap = p.logits_soft_cap;
    k.cap_log2 = float(double(p.logits_soft_cap) * M_LOG2E);
    k.score_scale_over_cap = float(score_scale / p.logits_soft_cap);
  }
  k.v_scale = p.v_scale;
  k.causal = p.mask_mode == MaskMode::kCausal;
  k.window_left = p.window_left;

  // The plan's split-KV chunk (Fa3Backend::plan chose it with split_kv::choose_chunk_keys).
  const int block_n = sched::block_n_for(p.head_dim_qk);
  if (plan.kv_chunk_size < 0 || plan.kv_chunk_size % block_n != 0) {
    return make_error(ErrorCode::kInvalidArgument, "fa3: plan.kv_chunk_size ", plan.kv_chunk_size,
                      " must be 0 (no split) or a positive multiple of the K/V block of ", block_n,
                      " keys at head dim ", p.head_dim_qk, " (make the plan with fa3)");
  }
  for (size_t b = 0; b < plan.qo_len.size(); ++b) {
    if (plan.qo_len[b] > pack::kMaxPackedRows / k.rows_per_token) {
      return make_error(ErrorCode::kNotSupported, "fa3: request ", b, " has qo_len ",
                        plan.qo_len[b], " x ", k.rows_per_token,
                        " packed rows per token, more than the kernel's 2^31 - 1 rows");
    }
  }
  const cuda::RequestStarts starts = cuda::request_starts(p, args);
  const split_kv::SplitPlan split =
      split_kv::make_split_plan(plan.qo_len, plan.kv_len, starts.q_row, plan.kv_chunk_size);
  k.chunk_blocks = int(plan.kv_chunk_size / block_n);
  std::vector<RequestInfo> requests(plan.qo_len.size());
  for (size_t b = 0; b < requests.size(); ++b) {
    requests[b] = RequestInfo{starts.q_row[b],    plan.qo_len[b],        plan.kv_len[b],
                              starts.kv_first[b], split.partial_base[b], split.chunks[b]};
  }
  const std::vector<sched::Tile> tiles =
      sched::ordered_tiles(plan.qo_len, plan.kv_len, p.num_qo_heads, k.causal, k.window_left,
                           block_n, k.rows_per_token, plan.kv_chunk_size);
  if (tiles.empty()) return Status::Ok();

  cuda::DeviceBuffer requests_dev, tiles_dev, indices_dev, partial_o, partial_lse, merge_rows;
  KVATTN_RETURN_IF_ERROR(requests_dev.upload(requests));
  KVATTN_RETURN_IF_ERROR(tiles_dev.upload(tiles));
  if (k.paged) {
    KVATTN_RETURN_IF_ERROR(indices_dev.upload(read_indices(args.kv_indices)));
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
  k.num_tiles = int(tiles.size());
  const int sms = std::max(1, sm_count(plan.device.index));
  const int err = kernel->launch(k, std::min(sms, k.num_tiles), nullptr);
  KVATTN_RETURN_IF_ERROR(cuda::cuda_status("fa3 attention kernel", cudaError_t(err)));
  if (!split.merge_rows.empty()) {
    merge_kernel<<<int(split.merge_rows.size()), kMergeThreads>>>(
        merge_rows.as<split_kv::MergeRow>(), k, p.head_dim_vo);
    KVATTN_RETURN_IF_ERROR(cuda::cuda_status("fa3 merge kernel", cudaGetLastError()));
  }
  return Status::Ok();
}

int device_sm_count(int index) { return sm_count(index); }

}  // namespace kvattn::fa3
