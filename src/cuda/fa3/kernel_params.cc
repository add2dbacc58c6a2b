// fa3's kernel parameters on the host (kernel_params.h).
#include "cuda/fa3/kernel_params.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/math_constants.h"
#include "core/run_scalars.h"
#include "core/status_macros.h"
#include "cuda/common/problem_layout.h"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/tile_size.h"
#include "cuda/fa3/kernels/tma_coords.h"
#include "cuda/fa3/tile_order.h"

namespace kvattn::fa3 {
namespace {

// Whether every row of `t` is a run of 16-byte chunks: a dense dim, and the base and the given
// strides multiples of 16 bytes. The kernel then moves a row 16 bytes at a time (loads, cp.async,
// TMA boxes); other rows it gathers byte by byte (kv_copies.h's gather16), so no layout is
// refused here: can_implement, which sees no tensor, stays the only judge of what fa3 runs.
bool rows_in_chunks(const TensorView& t, std::initializer_list<int64_t> strides,
                    int64_t dim_stride) {
  const int64_t elem = int64_t(dtype_size(t.dtype));
  bool ok = dim_stride == 1 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (int64_t s : strides) ok = ok && (s * elem) % 16 == 0;
  return ok;
}

std::vector<int32_t> read_indices(const TensorView& t) {
  std::vector<int32_t> v(t.rank == 1 ? size_t(t.shape[0]) : 0);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<const int32_t*>(t.data)[i * t.strides[0]];
  return v;
}

// The map over K or V: a paged cache [pages, page_size, H_kv, D] (either layout: strides `s`, in
// elements), or dense / ragged [tokens, H_kv, D] as one page of `rows` tokens. Dims innermost
// first: D, H_kv, slots, pages; box 128 bytes x 1 x the K/V block (block_n keys) x 1, one 128-byte
// panel of the tile (smem_layout.h's tma_panel_offset): 64 16-bit or 128 FP8 columns. An FP8 row
// of 64 or 192 bytes (head dims 64 and 192) ends inside its last panel: that box reads past D,
// and TMA fills the columns past the tensor's with zeros, which is the padding tile_offset8 leaves
// there (the bytes expected on the mbarrier are the whole box's, zeros included).
KvMapSpec kv_map_spec(DType dtype, const void* data, int64_t rows, int64_t pages, int heads,
                      int head_dim, int block_n, const paged::CacheStrides& s) {
  const int64_t elem = int64_t(dtype_size(dtype));
  KvMapSpec m;
  m.dtype = dtype;
  m.data = data;
  m.dims[0] = uint64_t(head_dim);
  m.dims[1] = uint64_t(heads);
  m.dims[2] = uint64_t(rows);
  m.dims[3] = uint64_t(pages);
  m.strides[0] = uint64_t(s.head * elem);
  m.strides[1] = uint64_t(s.slot * elem);
  // One page (dense, ragged): its stride is never stepped; the slot stride stands in for it (a
  // valid stride, a multiple of 16 bytes as rows_in_chunks found).
  m.strides[2] = uint64_t((pages > 1 ? s.page : s.slot) * elem);
  m.box[0] = uint32_t(smem::kRowBytes / elem);
  m.box[1] = 1;
  m.box[2] = uint32_t(block_n);
  m.box[3] = 1;
  return m;
}

}  // namespace

Status make_kernel_inputs(const Plan& plan, const AttentionArgs& args, const EncodeKvMap& encode,
                          KernelInputs* out) {
  const Problem& p = plan.problem;
  const TensorView& kt = is_paged(p.op) ? args.paged_k_cache : args.k;
  const TensorView& vt = is_paged(p.op) ? args.paged_v_cache : args.v;
  PrefillParams& k = out->params;
  k = PrefillParams{};
  // Single decode: q [H_qo, D_qk], out [H_qo, D_vo], lse [H_qo] (one token, row stride 0).
  const bool single_decode = p.op == Op::kSingleDecode;
  const int dim_axis = single_decode ? 1 : 2;
  k.q = args.q.data;
  k.q_stride_row = single_decode ? 0 : args.q.strides[0];
  k.q_stride_head = args.q.strides[dim_axis - 1];
  k.q_stride_dim = args.q.strides[dim_axis];
  k.q_chunks = rows_in_chunks(args.q, {k.q_stride_row, k.q_stride_head}, k.q_stride_dim);
  k.k = kt.data;
  k.v = vt.data;
  k.k_strides = paged::kv_strides(p, kt);
  k.v_strides = paged::kv_strides(p, vt);
  k.k_chunks =
      rows_in_chunks(kt, {k.k_strides.page, k.k_strides.slot, k.k_strides.head}, k.k_strides.dim);
  k.v_chunks =
      rows_in_chunks(vt, {k.v_strides.page, k.v_strides.slot, k.v_strides.head}, k.v_strides.dim);
  k.paged = is_paged(p.op);
  k.page_div = cuda::FastDiv(uint32_t(p.page_size > 0 ? p.page_size : 1));
  // The kernel's tile shape (tile_size.h): its K/V block is the TMA box's depth, the tile list's
  // and the split chunks' unit.
  const TileShape shape = tile_shape(p.head_dim_qk, p.head_dim_vo, is_fp8(p.kv_dtype) ? 1 : 2);
  const int block_n = shape.block_n;
  if (k.k_chunks && k.v_chunks) {
    // K/V in 16-byte chunks go through TMA (16-bit K and V; FP8 K, and FP8 V into a staging tile
    // that the producer transposes: producer.h's produce): dense and ragged tensors of fewer
    // than 2^31 tokens (a box's token coordinate would wrap past them: tma_coords.h), and paged
    // caches whose page size is a multiple of the K/V block (a block is one box in one page).
    // Otherwise the producer's threads copy (cp.async, or gather rows not in chunks).
    int64_t rows = 0, pages = 1;
    if (k.paged) {
      pages = kt.shape[0];
      if (p.page_size % block_n == 0 && pages <= kMaxTmaCoordinate) rows = p.page_size;
    } else {
      // The token dim is the one with the slot stride.
      const bool hnd = p.op != Op::kBatchPrefillRagged && p.kv_layout == KVLayout::kHND;
      const int64_t tokens = hnd ? kt.shape[1] : kt.shape[0];
      if (tma_token_coordinates_fit(tokens)) rows = tokens;
    }
    k.tma = rows > 0 && pages > 0 &&
            encode(&k.tma_k, kv_map_spec(p.kv_dtype, kt.data, rows, pages, p.num_kv_heads,
                                         p.head_dim_qk, block_n, k.k_strides)) &&
            encode(&k.tma_v, kv_map_spec(p.kv_dtype, vt.data, rows, pages, p.num_kv_heads,
                                         p.head_dim_vo, block_n, k.v_strides));
  }
  k.out = args.out.data;
  k.o_stride_row = single_decode ? 0 : args.out.strides[0];
  k.o_stride_head = args.out.strides[dim_axis - 1];
  k.o_stride_dim = args.out.strides[dim_axis];
  k.o_chunks = rows_in_chunks(args.out, {k.o_stride_row, k.o_stride_head}, k.o_stride_dim);
  k.out_kind = cuda::out_kind(p.o_dtype);
  if (!args.lse.empty()) {
    k.lse = static_cast<float*>(args.lse.data);
    k.lse_scale = lse_store_scale(args.scalars);
    k.lse_stride_row = single_decode ? 0 : args.lse.strides[0];
    k.lse_stride_head = args.lse.strides[single_decode ? 0 : 1];
  }
  k.group = p.group_size();
  k.num_qo_heads = p.num_qo_heads;
  k.rows_per_token = pack::rows_per_token(is_decode(p.op), k.group);
  const double score_scale =
      double(p.effective_sm_scale()) * args.scalars.q_scale * args.scalars.k_scale;
  k.score_scale_log2 = float(score_scale * math::kLog2eF64);
  if (p.logits_soft_cap > 0) {
    k.soft_cap = p.logits_soft_cap;
    k.cap_log2 = float(double(p.logits_soft_cap) * math::kLog2eF64);
    k.score_scale_over_cap = float(score_scale / p.logits_soft_cap);
  }
  k.v_scale = args.scalars.v_scale;
  k.causal = p.mask_mode == MaskMode::kCausal;
  k.window_left = p.window_left;

  // The plan's split-KV chunk (Fa3Backend::plan chose it with split_kv::choose_chunk_keys).
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
  out->split =
      split_kv::make_split_plan(plan.qo_len, plan.kv_len, starts.q_row, plan.kv_chunk_size);
  k.chunk_blocks = int(plan.kv_chunk_size / block_n);
  out->requests.assign(plan.qo_len.size(), RequestInfo{});
  for (size_t b = 0; b < out->requests.size(); ++b) {
    out->requests[b] = RequestInfo{starts.q_row[b],
                                   plan.qo_len[b],
                                   plan.kv_len[b],
                                   starts.kv_first[b],
                                   out->split.partial_base[b],
                                   out->split.chunks[b]};
  }
  int64_t max_rows = 0;
  for (int64_t qo : plan.qo_len) {
    max_rows = std::max(max_rows, pack::packed_rows(qo, k.rows_per_token));
  }
  k.consumer_warpgroups = consumer_warpgroups(shape, max_rows);
  out->tiles = sched::ordered_tiles(plan.qo_len, plan.kv_len, p.num_qo_heads, k.causal,
                                    k.window_left, block_n, k.rows_per_token, plan.kv_chunk_size);
  out->kv_indices = k.paged ? read_indices(args.kv_indices) : std::vector<int32_t>{};
  k.num_tiles = int(out->tiles.size());
  return Status::Ok();
}

}  // namespace kvattn::fa3
