// What a prefill kernel reads: plain data made by run_prefill from the plan and the arguments.
// Shared by every ISA's kernel file, so it holds types only (no inline code that each ISA's flags
// would compile differently).
#pragma once

#include <cstdint>

#include "core/math_constants.h"  // kLog2e of the kernel body (kernel.h)
#include "core/paged_kv.h"
#include "cpu/common/epilogue.h"
#include "cpu/prefill/tile_config.h"
#include "kvattn/attention.h"
#include "kvattn/dtype.h"

namespace kvattn::cpu::prefill {

// Where K (or V) row j of request b, KV head h starts, in elements of `base`:
// strides.offset(page, slot, h, 0) (core/paged_kv.h), with
//   contiguous (single, ragged): page 0, slot kv_token_begin[b] + j
//   paged: page = page_ids[page_begin[b] + j / page_size], slot j % page_size
struct KVSource {
  const void* base = nullptr;
  paged::CacheStrides strides;
};

struct RequestInfo {
  int64_t qo_begin = 0;  // first query row of the request in q / out / lse
  int64_t qo_len = 0, kv_len = 0;
  int64_t kv_token_begin = 0;  // contiguous K/V: first token row
  int64_t page_begin = 0;      // paged: first entry of the request in page_ids
  int64_t mask_begin = 0;      // custom mask: first byte of the request
};

struct PrefillParams {
  PrefillTile tile;
  ScratchLayout scratch;
  const RequestInfo* requests = nullptr;

  // q [N, H_qo, D_qk] (strides in elements); the final rows out [N, H_qo, D_vo], lse [N, H_qo].
  const void* q = nullptr;
  DType q_dtype = DType::kF32;
  int64_t q_stride_token = 0, q_stride_head = 0, q_stride_dim = 1;
  OutputRows output;

  KVSource k, v;
  DType kv_dtype = DType::kF32;
  bool paged = false;
  int page_size = 1;
  const int32_t* page_ids = nullptr;
  int64_t page_ids_stride = 1;

  int num_kv_heads = 1, group = 1, head_dim_qk = 0, head_dim_vo = 0;

  // q is multiplied by q_scale * qk_scale when staged; K by k_scale, V by v_scale. qk_scale is
  // sm_scale * log2(e) (scores live in the log2 domain so the softmax uses exp2), or
  // sm_scale / soft_cap with a soft cap, or 1 with the fp16 QK reduction (the rounding applies
  // to the raw dot product, see score_scale).
  float q_scale = 1.0f, k_scale = 1.0f, v_scale = 1.0f;
  float qk_scale = 1.0f;
  // kv_scale_granularity per_head: [H_kv] each, replacing k_scale / v_scale (null: per tensor).
  const float* k_head_scale = nullptr;
  const float* v_head_scale = nullptr;
  // per_token_head: each key's scale, addressed like its row (KVSource strides of the
  // [.., H_kv] scale tensors, dim unused); base null: none.
  KVSource k_token_scale, v_token_scale;
  // Attention sinks [H_qo] (natural log), joined in the final normalization; null: none.
  const float* sinks = nullptr;
  // Applied to S after the dot product: soft cap: s2 = score_scale * tanh(s) with
  // score_scale = cap * log2(e); fp16 reduction: s2 = round_f16(s) * score_scale with
  // score_scale = sm_scale * log2(e) (and the soft cap after it when both are on).
  bool fp16_qk_reduction = false;
  float soft_cap = 0.0f;         // > 0: on
  float reduction_scale = 1.0f;  // fp16 reduction: sm_scale (or sm_scale / cap), else unused
  float cap_log2e = 0.0f;        // cap * log2(e)

  bool causal = false;
  int64_t window_left = -1;  // < 0: none
  // Custom mask: u8 bytes with element stride; packed = bits little-endian.
  const uint8_t* custom_mask = nullptr;
  int64_t custom_mask_stride = 1;
  bool custom_mask_packed = false;

  const float* alibi_slopes_log2e = nullptr;  // [H_qo] slope * log2(e); null: no ALiBi

  // Fused RoPE: cos/sin table [pos - rope_pos_begin][D_qk / 2], interleaved (cos, sin).
  const float* rope_table = nullptr;
  int64_t rope_pos_begin = 0;
  bool rope_interleave = false;

  // The next KV tile's rows are prefetched into L1 (AMD) or L2 (Intel): NextTilePrefetch.
  bool prefetch_l1 = false;
};

// Runs one task: the plan work items items[0, heads) (a range of query tokens of one request,
// cut in tiles; KV heads items[0].kv_head + 0, 1, ..., heads - 1, whose K and V rows lie side by
// side in each token's row where heads > 1) with the per-thread scratch `scratch` (scratch.floats
// floats, 64-byte aligned, laid out for `heads` heads: ScratchLayout::for_head), each KV tile
// over all of its heads in turn (kernel.h's run_tile).
using PrefillItemFn = void (*)(const PrefillParams& params, const WorkItem* items, int heads,
                               float* scratch);

PrefillItemFn prefill_item_fn_scalar();
PrefillItemFn prefill_item_fn_avx2();    // null when not built
PrefillItemFn prefill_item_fn_avx512();  // null when not built
// bf16 dot products (AVX512_BF16) for bf16 q over bf16 / fp8 K/V; null when not built.
PrefillItemFn prefill_item_fn_avx512_bf16();
// AMX-BF16 tiles for the same problems (head dims multiples of 32); null when not built.
PrefillItemFn prefill_item_fn_amx();
// The same kernel body on emulated tiles (common/amx.h), for tests on CPUs without AMX; built with
// KVATTN_CPU_AMX_EMULATION.
PrefillItemFn prefill_item_fn_amx_emulated();

}  // namespace kvattn::cpu::prefill
