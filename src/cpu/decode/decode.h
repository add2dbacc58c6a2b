// The CPU decode path (single_decode, batch_decode): plain-data parameters shared by the planner
// (decode.cc, portable) and the per-ISA kernels (decode_kernel.h instantiated by decode_<isa>.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/paged_kv.h"
#include "cpu/common/epilogue.h"
#include "cpu/decode/decode_prefetch.h"
#include "kvattn/attention.h"
#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::cpu {

// Keys per tile: scores of a tile are computed, softmaxed and applied before the next tile. 32
// keys of K and V (bf16, d 128: 16 KiB) stay in L1 between the QK and the PV pass, and one tile
// ahead is prefetched. Also the granularity of the split-KV chunks the planner makes.
inline constexpr int kDecodeTileKeys = 32;
// Every per-query f32 row in scratch is padded to this many floats, the widest vector.
inline constexpr int kDecodeRowPad = 16;
// Query heads of a GQA group are padded to 1, 2, 4, 8 or a multiple of 8 (zero queries).
int decode_padded_group(int group);

struct DecodeParams {
  int group = 1, group_padded = 1;
  int head_dim_qk = 0, head_dim_vo = 0;
  int head_dim_qk_padded = 0, head_dim_vo_padded = 0;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16;

  // q element (b, qo_head, d) at q + (b*q_stride_b + qo_head*q_stride_h + d*q_stride_d).
  const std::byte* q = nullptr;
  int64_t q_stride_b = 0, q_stride_h = 0, q_stride_d = 1;
  // Key j of request b, KV head h: page = kv_indices[(kv_indptr[b] + j / page_size) *
  // indices_stride], row at base + k_strides.offset(page, j % page_size, h, 0) elements. The
  // single ops use one page of the whole length.
  const std::byte* k = nullptr;
  const std::byte* v = nullptr;
  paged::CacheStrides k_strides, v_strides;
  int64_t page_size = 1;
  const int32_t* kv_indptr = nullptr;
  const int32_t* kv_indices = nullptr;
  int64_t indptr_stride = 1, indices_stride = 1;
  const int64_t* kv_len = nullptr;  // per request

  // q_scale is applied to the staged q only where the raw dot is rounded to f16 (which must see
  // the scaled q); elsewhere it is folded into sm_scale, so the bf16 dot products take q exactly
  // as stored: (q * q_scale) . k * sm_scale = q . k * (q_scale * sm_scale).
  float q_scale = 1, k_scale = 1, v_scale = 1, sm_scale = 1;
  // kv_scale_granularity per_head: [H_kv] each (k_scale / v_scale are then 1).
  const float* k_head_scale = nullptr;
  const float* v_head_scale = nullptr;
  // per_token_head: the scale of key j of request b, KV head h sits at
  // k_token_scale[ks_strides.offset(page, j % page_size, h, 0)], page as for the K row (likewise
  // v_*).
  const float* k_token_scale = nullptr;
  const float* v_token_scale = nullptr;
  paged::CacheStrides ks_strides, vs_strides;
  // Attention sinks [H_qo] (natural-log logits) or null; joined when the final state is formed.
  const float* sinks = nullptr;
  float logits_soft_cap = 0;            // > 0: on
  bool fp16_qk_reduction = false;       // the real q.k rounded to f16 once, before sm_scale
  const float* alibi_slopes = nullptr;  // [H_qo] when ALiBi is on
  bool rope = false, rope_interleave = false;
  double rope_theta = 1e4, rope_scale = 1;
  int window_left = -1;
  // Custom mask: element (or, packed, bit) of key j of request b at mask_begin[b] + j.
  const uint8_t* mask = nullptr;
  int64_t mask_stride = 1;
  bool mask_packed = false;
  const int64_t* mask_begin = nullptr;

  // How the next tile's prefetches ask for its lines (decode_prefetch.h): the CPU class's.
  decode_detail::DecodePrefetch prefetch;
  // Whether tasks over the fp32-FMA tiles take several KV heads a step on NHD caches
  // (FmaTiles::kStepHeads): the CPU class's choice (CpuFeatures::decode_fma_head_steps) or
  // KVATTN_CPU_FMA_HEAD_STEPS (decode.cc).
  bool fma_head_steps = false;
  // Whether tasks over the dot-product tiles with the query rows in the lanes, where one head a
  // step keeps them in registers (DotTiles::kLaneQueriesInRegisters), take several KV heads a step
  // on NHD caches: the CPU class's choice (CpuFeatures::decode_lane_head_steps) or
  // KVATTN_CPU_LANE_HEAD_STEPS (decode.cc).
  bool lane_head_steps = true;

  // Final rows: token b (one query per request), head qo_head. Split requests: partial state s
  // (= WorkItem::partial) of query g is partial.row(s, g) (rows = group).
  OutputRows output;
  PartialStates partial;

  // True where each token's K rows of consecutive heads lie side by side (NHD, unit-stride rows):
  // the head steps (decode_kernel.h: takes_head_steps) and the wider NHD tasks
  // (decode_max_task_heads) read a token's heads as one run.
  bool k_heads_adjacent() const {
    return k_strides.dim == 1 && head_dim_qk > 0 && k_strides.head == head_dim_qk;
  }

  // True when the general score path (soft cap, ALiBi, custom mask) is needed.
  bool general_scores() const {
    return logits_soft_cap > 0 || alibi_slopes != nullptr || mask != nullptr || fp16_qk_reduction;
  }
};

// KV heads one task takes at most: their queries and accumulators (16 KiB each for 8 heads of
// group 4, d 128) stay in L1/L2 while the tile's rows of all of them stream in.
inline constexpr int kDecodeMaxTaskHeads = 16;
// Where a token's heads lie side by side (NHD), a task takes up to kDecodeMaxTaskRows query rows
// (heads x padded group) instead: 64 heads of MHA (group 1), 32 of group 2, so that it reads whole
// token rows. Cut at 16 heads, MHA over 32 NHD heads read each token's row in two halves 4 KiB
// apart, two tasks at different times, and one Zen 5 thread read 7.0 GB/s from DRAM (bf16, B16 x
// 1k) where HND read 26 (issue 23). Over HND the wider tasks ran 0.89-0.93x (their next tile's
// prefetch is 4x as large), so HND keeps 16.
inline constexpr int kDecodeMaxTaskRows = 64;
inline constexpr int decode_max_task_heads(int group_padded, bool token_major) {
  return !token_major || group_padded * kDecodeMaxTaskHeads >= kDecodeMaxTaskRows
             ? kDecodeMaxTaskHeads
             : kDecodeMaxTaskRows / group_padded;
}

// KV heads one head step of a task takes together at most (decode_kernel.h, DotTiles::kStepHeads:
// adjacent NHD rows, 2-8 heads a visit); the scores scratch holds this many heads' rows.
inline constexpr int kDecodeMaxStepHeads = 8;

// Byte offsets of each thread's scratch. One function for the size and the layout.
struct DecodeScratchLayout {
  std::size_t q = 0, o = 0, scores = 0, max = 0, sum = 0, k_rows = 0, v_rows = 0, head_rows = 0,
              rope_k = 0, rope_cos_sin = 0, mask = 0, nan_key = 0, scale_offsets = 0,
              token_scales = 0, bytes = 0;
  static DecodeScratchLayout make(int group_padded, int head_dim_qk_padded, int head_dim_vo_padded,
                                  bool rope, bool token_scales);
};

// The task a thread runs after the one it is running (claimed before that one runs:
// ThreadPool::parallel_for_ahead), whose first tile's lines the running task's last tile asks
// for; `items` null where there is none.
struct NextDecodeTask {
  const WorkItem* items = nullptr;
  int num_heads = 0;
};

// One task of the decode kernel: work items items[0, num_heads) of one request and KV range on
// consecutive KV heads; all query heads of each over keys [kv_begin, kv_end), writing the output
// (partial < 0) or partial state `partial`. first_tile_asked: the task before it on the thread
// has asked for its first tile's lines (as `next`), so it does not ask again.
using DecodeItemFn = void (*)(const DecodeParams& params, const WorkItem* items, int num_heads,
                              bool first_tile_asked, const NextDecodeTask& next,
                              std::byte* scratch);

// Kernels per ISA (reached through the kernel table, kernel_table.h); each returns nullptr where
// no kernel fits. The vector ISAs need unit-stride K/V rows; the scalar kernels take any stride.
DecodeItemFn find_decode_kernel_scalar(DType kv, int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx2(DType kv, int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx512(DType kv, int dqk, int dvo, int group_padded);
// FP8 caches widened to bf16 by byte tables (decode_fp8_table.h), then bf16 dot
// products (`bf16_dot`: AVX512_BF16) or fp32 FMAs on the parity-split words (AVX512_VBMI): e4m3 /
// e5m2 at head dims 64, 128, 256 (equal); nullptr otherwise. The table's rules for them
// (kernel_table.cc) say which problems they compute; the bf16 dot products are its default only
// where vdpbf16ps is fast (AMD: on the Intel Xeon measured it retires at a quarter of the FMA
// rate, `kvattn bench`: bf16 dot peak 136 GFLOP/s against 265 for FMA, and the kernel ran ~10%
// slower than the fp32-FMA one; on Zen 4 the issue 14 prototype found it faster, 0.59 against
// 0.48 of the roofline).
DecodeItemFn find_decode_kernel_fp8_table_avx512(DType kv, int dqk, int dvo, int group_padded,
                                                 bool bf16_dot);
// bf16 caches with bf16 dot products (decode_bf16_dot_avx512bf16.cc; AVX512_BF16): head dims 64,
// 128, 256 (equal); nullptr otherwise. Preferred over the fp32-FMA kernel where vdpbf16ps is
// fast, as above.
DecodeItemFn find_decode_kernel_bf16_dot_avx512(DType kv, int dqk, int dvo, int group_padded);
// FP8 caches widened by the byte tables onto AMX-BF16 tiles (decode_fp8_amx.cc): head dim d =
// 64, 128, 256 (equal K and V dims), padded groups of 1, 2, 4, 8 or 16 rows; and the same kernel
// on emulated tiles (common/amx.h), built with KVATTN_CPU_AMX_EMULATION, for the tests.
DecodeItemFn find_decode_kernel_fp8_amx(DType kv, int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_fp8_amx_emulated(DType kv, int dqk, int dvo, int group_padded);

// Plans a decode op: one item per (request, KV head), or per KV chunk of it when split.
Status plan_decode(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                   Plan* plan);
Status run_decode(const Plan& plan, const AttentionArgs& args, void* workspace,
                  std::size_t workspace_bytes);
// The same for the decode problem `problem` a plan of another op was cut for (run_prefill: a
// prefill of one query token per request, planned by plan_decode).
Status run_decode(const Plan& plan, const Problem& problem, const AttentionArgs& args,
                  void* workspace, std::size_t workspace_bytes);

}  // namespace kvattn::cpu
