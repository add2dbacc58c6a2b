// Decode planning (the split-KV decision), the run driver and the merge of split requests.
#include "cpu/decode/decode.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/cpu_features.h"
#include "core/int_math.h"
#include "core/paged_kv.h"
#include "core/run_scalars.h"
#include "core/status_macros.h"
#include "cpu/common/driver.h"
#include "cpu/kernel_table.h"

namespace kvattn::cpu {
namespace {

// Below this many keys per chunk the merge and the per-item prologue cost more than the
// parallelism gains.
constexpr int64_t kMinAutoChunk = 256;

// Tasks of up to this many keys claim their successor before they run (run_decode).
constexpr int64_t kClaimAheadKeys = 16 * kDecodeTileKeys;

int pad_to(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// A CPU class's decode choice, or the environment switch `name` (1 or 0) where set: read at every
// run, as KVATTN_CPU_KERNEL (tests, and A/B runs on the classes whose choice is not measured).
// KVATTN_CPU_FMA_HEAD_STEPS: the fp32-FMA tasks' steps of several heads
// (CpuFeatures::decode_fma_head_steps); KVATTN_CPU_LANE_HEAD_STEPS: those of the dot-product
// tasks with the query rows in the lanes (CpuFeatures::decode_lane_head_steps).
bool class_choice_or_env(const char* name, bool class_choice) {
  const char* env = std::getenv(name);
  if (env != nullptr && *env != '\0') return std::string_view(env) != "0";
  return class_choice;
}

// The keys query position kv_len - 1 can see at all: [lo, kv_len).
int64_t first_visible_key(const Problem& problem, int64_t kv_len) {
  if (problem.window_left < 0) return 0;
  return std::max<int64_t>(0, kv_len - 1 - problem.window_left);
}

// Workspace of a decode run (common/driver.h): partial states of split items, per-request mask
// offsets, ALiBi slopes, sinks, per-head scales, then one scratch per thread.
struct DecodeWorkspace {
  std::size_t partial_o = 0, partial_lse = 0, mask_begin = 0, alibi = 0, sinks = 0, k_head = 0,
              v_head = 0, scratch = 0;
  WorkspaceLayout layout;

  DecodeWorkspace(const Problem& problem, int64_t num_partial, int threads) {
    const int group = problem.group_size();
    partial_o = layout.take(sizeof(float) * num_partial * group * problem.head_dim_vo);
    partial_lse = layout.take(sizeof(float) * num_partial * group);
    mask_begin = layout.take(sizeof(int64_t) * problem.batch_size);
    alibi = layout.take(sizeof(float) * problem.num_qo_heads);
    sinks = layout.take(sizeof(float) * problem.num_qo_heads);
    k_head = layout.take(sizeof(float) * problem.num_kv_heads);
    v_head = layout.take(sizeof(float) * problem.num_kv_heads);
    scratch = layout.take_per_thread(
        DecodeScratchLayout::make(decode_padded_group(group),
                                  pad_to(problem.head_dim_qk, kDecodeRowPad),
                                  pad_to(problem.head_dim_vo, kDecodeRowPad),
                                  problem.pos_encoding_mode == PosEncoding::kRopeLlama,
                                  problem.kv_scale_granularity == KVScaleGranularity::kPerTokenHead)
            .bytes,
        threads);
  }
};

float read_f32(const TensorView& t, int64_t i) { return t.as<const float>()[i * t.strides[0]]; }

}  // namespace

int decode_padded_group(int group) {
  if (group <= 1) return 1;
  if (group <= 2) return 2;
  if (group <= 4) return 4;
  return pad_to(group, 8);
}

DecodeScratchLayout DecodeScratchLayout::make(int group_padded, int head_dim_qk_padded,
                                              int head_dim_vo_padded, bool rope,
                                              bool token_scales) {
  DecodeScratchLayout l;
  WorkspaceLayout at;
  const int heads = decode_max_task_heads(group_padded, /*token_major=*/true);  // the larger
  l.q = at.take(sizeof(float) * heads * group_padded * head_dim_qk_padded);
  l.o = at.take(sizeof(float) * heads * group_padded * head_dim_vo_padded);
  l.scores = at.take(sizeof(float) * kDecodeMaxStepHeads * group_padded * kDecodeTileKeys);
  l.max = at.take(sizeof(float) * heads * group_padded);
  l.sum = at.take(sizeof(float) * heads * group_padded);
  l.k_rows = at.take(sizeof(void*) * 2 * kDecodeTileKeys);
  l.v_rows = at.take(sizeof(void*) * 2 * kDecodeTileKeys);
  l.head_rows = at.take(sizeof(void*) * 2 * kDecodeTileKeys);
  l.mask = at.take(kDecodeTileKeys);
  l.nan_key = at.take(heads);
  if (token_scales) {
    l.scale_offsets = at.take(sizeof(int64_t) * 2 * 2 * kDecodeTileKeys);  // [K, V][2][tile]
    l.token_scales = at.take(sizeof(float) * 2 * kDecodeTileKeys);         // [K, V][tile]
  }
  if (rope) {
    l.rope_k = at.take(sizeof(float) * kDecodeTileKeys * head_dim_qk_padded);
    l.rope_cos_sin = at.take(sizeof(double) * 5 * (head_dim_qk_padded / 2));
  }
  l.bytes = at.size();
  return l;
}

Status plan_decode(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                   Plan* plan) {
  request_lengths(problem, args, &plan->qo_len, &plan->kv_len);
  const int threads = resolve_num_threads(options.num_threads);
  plan->num_threads = threads;

  const int batch = problem.batch_size, heads = problem.num_kv_heads;
  int64_t chunk = options.kv_chunk_size;
  if (chunk == 0) {
    // Automatic: split only when there are too few tasks (request x block of up to
    // kDecodeMaxTaskHeads KV heads, see run_decode) to keep every thread busy; then cut the
    // longest range into enough tile-aligned chunks.
    int64_t max_len = 0;
    for (int b = 0; b < batch; ++b) {
      max_len = std::max(max_len, plan->kv_len[b] - first_visible_key(problem, plan->kv_len[b]));
    }
    const int task_heads = decode_max_task_heads(decode_padded_group(problem.group_size()),
                                                 problem.kv_layout == KVLayout::kNHD);
    const int64_t tasks = int64_t{batch} * ceil_div(heads, task_heads);
    chunk = auto_kv_chunk(tasks, max_len, threads, kDecodeTileKeys, kMinAutoChunk);
  }
  plan->kv_chunk_size = chunk;

  plan->work.clear();
  int64_t partial = 0;
  for (int b = 0; b < batch; ++b) {
    const int64_t hi = plan->kv_len[b];
    const int64_t lo = std::min(first_visible_key(problem, hi), hi);
    // Chunks start at multiples of the chunk size counted from key 0, so a request is cut the
    // same way whatever else is in the batch.
    const int64_t first_chunk = chunk > 0 ? lo / chunk : 0;
    const int64_t last_chunk = chunk > 0 && hi > lo ? (hi - 1) / chunk : first_chunk;
    const bool split = last_chunk > first_chunk;
    // Heads innermost: the items of one chunk on consecutive heads run as one task.
    for (int64_t c = first_chunk; c <= last_chunk; ++c) {
      for (int h = 0; h < heads; ++h) {
        WorkItem w;
        w.request = b;
        w.kv_head = h;
        w.qo_begin = 0;
        w.qo_end = 1;
        w.kv_begin = split ? std::max(lo, c * chunk) : lo;
        w.kv_end = split ? std::min(hi, (c + 1) * chunk) : hi;
        w.partial = split ? static_cast<int32_t>(partial++) : -1;
        plan->work.push_back(w);
      }
    }
  }
  plan->num_partial_states = partial;
  plan->workspace_bytes = DecodeWorkspace(problem, partial, threads).layout.bytes();
  return Status::Ok();
}

Status run_decode(const Plan& plan, const AttentionArgs& args, void* workspace,
                  std::size_t workspace_bytes) {
  return run_decode(plan, plan.problem, args, workspace, workspace_bytes);
}

Status run_decode(const Plan& plan, const Problem& pb, const AttentionArgs& args, void* workspace,
                  std::size_t workspace_bytes) {
  const DecodeWorkspace layout(pb, plan.num_partial_states, plan.num_threads);
  std::byte* ws = nullptr;
  KVATTN_RETURN_IF_ERROR(
      bind_workspace("decode", layout.layout, workspace, workspace_bytes, &ws));
  const bool single = pb.op == Op::kSingleDecode;

  DecodeParams p;
  p.group = pb.group_size();
  p.group_padded = decode_padded_group(p.group);
  p.head_dim_qk = pb.head_dim_qk;
  p.head_dim_vo = pb.head_dim_vo;
  p.head_dim_qk_padded = pad_to(pb.head_dim_qk, kDecodeRowPad);
  p.head_dim_vo_padded = pad_to(pb.head_dim_vo, kDecodeRowPad);
  p.q_dtype = pb.q_dtype;
  p.kv_dtype = pb.kv_dtype;

  p.q = static_cast<const std::byte*>(args.q.data);
  p.q_stride_b = single ? 0 : args.q.strides[0];
  p.q_stride_h = args.q.strides[single ? 0 : 1];
  p.q_stride_d = args.q.strides[single ? 1 : 2];
  p.output = OutputRows::of(args);

  static const int32_t kSinglePageIndptr[2] = {0, 1};
  static const int32_t kSinglePage[1] = {0};
  const TensorView& k = single ? args.k : args.paged_k_cache;
  const TensorView& v = single ? args.v : args.paged_v_cache;
  p.k = static_cast<const std::byte*>(k.data);
  p.v = static_cast<const std::byte*>(v.data);
  p.k_strides = paged::kv_strides(pb, k);
  p.v_strides = paged::kv_strides(pb, v);
  if (single) {
    p.page_size = std::max<int64_t>(plan.kv_len[0], 1);
    p.kv_indptr = kSinglePageIndptr;
    p.kv_indices = kSinglePage;
  } else {
    p.page_size = pb.page_size;
    p.kv_indptr = args.kv_indptr.as<const int32_t>();
    p.indptr_stride = args.kv_indptr.strides[0];
    p.kv_indices = args.kv_indices.as<const int32_t>();
    p.indices_stride = args.kv_indices.rank > 0 ? args.kv_indices.strides[0] : 1;
  }
  p.kv_len = plan.kv_len.data();
  const detail::CpuFeatures& cpu = detail::cpu_features();
  p.prefetch = cpu.decode_prefetch;
  p.fma_head_steps = class_choice_or_env("KVATTN_CPU_FMA_HEAD_STEPS", cpu.decode_fma_head_steps);
  p.lane_head_steps = class_choice_or_env("KVATTN_CPU_LANE_HEAD_STEPS", cpu.decode_lane_head_steps);

  const RunScalars& scalars = args.scalars;
  p.q_scale = pb.use_fp16_qk_reduction ? scalars.q_scale : 1.0f;
  p.k_scale = scalars.k_scale;
  p.v_scale = scalars.v_scale;
  // Per-head scales: a per_head plan's, or this layer's on a per_tensor plan.
  if (!args.k_scale.empty()) {
    auto* k_head = reinterpret_cast<float*>(ws + layout.k_head);
    auto* v_head = reinterpret_cast<float*>(ws + layout.v_head);
    for (int h = 0; h < pb.num_kv_heads; ++h) {
      k_head[h] = read_f32(args.k_scale, h);
      v_head[h] = read_f32(args.v_scale, h);
    }
    p.k_head_scale = k_head;
    p.v_head_scale = v_head;
  }
  if (pb.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    // [kv_len, H_kv] beside single K/V (one page of the whole length); [P, page_size, H_kv]
    // beside a paged cache.
    p.k_token_scale = args.k_scale_cache.as<const float>();
    p.v_token_scale = args.v_scale_cache.as<const float>();
    p.ks_strides = paged::scale_strides(pb, args.k_scale_cache);
    p.vs_strides = paged::scale_strides(pb, args.v_scale_cache);
  }
  if (!args.sinks.empty()) {
    auto* sinks = reinterpret_cast<float*>(ws + layout.sinks);
    for (int h = 0; h < pb.num_qo_heads; ++h) sinks[h] = read_f32(args.sinks, h);
    p.sinks = sinks;
  }
  p.sm_scale = pb.effective_sm_scale() * (pb.use_fp16_qk_reduction ? 1.0f : scalars.q_scale);
  p.logits_soft_cap = pb.logits_soft_cap > 0 ? pb.logits_soft_cap : 0.0f;
  p.fp16_qk_reduction = pb.use_fp16_qk_reduction;
  if (pb.pos_encoding_mode == PosEncoding::kAlibi) {
    auto* slopes = reinterpret_cast<float*>(ws + layout.alibi);
    for (int h = 0; h < pb.num_qo_heads; ++h) {
      slopes[h] = args.alibi_slopes.empty() ? static_cast<float>(alibi_slope(h, pb.num_qo_heads))
                                            : read_f32(args.alibi_slopes, h);
    }
    p.alibi_slopes = slopes;
  }
  p.rope = pb.pos_encoding_mode == PosEncoding::kRopeLlama;
  p.rope_interleave = pb.rope_interleave;
  p.rope_theta = pb.rope_theta;
  p.rope_scale = pb.rope_scale;
  p.window_left = pb.window_left;
  if (pb.mask_mode == MaskMode::kCustom) {
    auto* begin = reinterpret_cast<int64_t*>(ws + layout.mask_begin);
    int64_t at = 0;
    for (int b = 0; b < pb.batch_size; ++b) {
      begin[b] = args.custom_mask_packed ? at * 8 : at;
      at += args.custom_mask_packed ? ceil_div(plan.kv_len[b], 8) : plan.kv_len[b];
    }
    p.mask = args.custom_mask.as<const uint8_t>();
    p.mask_stride = args.custom_mask.strides[0];
    p.mask_packed = args.custom_mask_packed;
    p.mask_begin = begin;
  }
  p.partial.o = reinterpret_cast<float*>(ws + layout.partial_o);
  p.partial.lse = reinterpret_cast<float*>(ws + layout.partial_lse);
  p.partial.rows = p.group;
  p.partial.dim = p.head_dim_vo;

  // The plan's kernel (kernel_table.h); the vector ones need unit-stride K/V rows.
  const CpuKernel* planned = nullptr;
  KVATTN_RETURN_IF_ERROR(planned_cpu_kernel(plan.kernel, KernelOp::kDecode, &planned));
  const bool contiguous = p.k_strides.dim == 1 && p.v_strides.dim == 1;
  const CpuKernel& chosen = contiguous ? *planned : strided_cpu_kernel(*planned);
  DecodeItemFn kernel = chosen.decode(pb, p.group_padded);
  if (!kernel) {
    return make_error(ErrorCode::kInternal, "cpu decode: no kernel for kv ",
                      dtype_name(pb.kv_dtype), ", head dims ", pb.head_dim_qk, "/", pb.head_dim_vo,
                      ", group ", p.group);
  }
  // Tasks: runs of consecutive items of one request and KV range on consecutive heads (one head
  // each under fused RoPE, whose per-tile tables are per head).
  const std::vector<HeadRun> tasks = head_runs(
      plan.work, p.rope ? 1 : decode_max_task_heads(p.group_padded, p.k_heads_adjacent()));
  // A thread claims the task it runs next before it runs a short one, whose last tile then asks
  // for the next one's first tile (NextDecodeTask), and the next one does not ask again
  // (`claimed`): else each short request's first tile was read in a burst at its start, the cost
  // of one tile in eight at 256 keys. Long tasks claim after they end (a task held in reserve
  // while a long one runs could leave the other threads idle at the end); an empty one asks for
  // nothing, so claims after it too.
  auto claims_ahead = [&](int64_t t) {
    const WorkItem& w = plan.work[tasks[t].first];
    return w.kv_end > w.kv_begin && w.kv_end - w.kv_begin <= kClaimAheadKeys;
  };
  for_each_item_ahead(plan.num_threads, static_cast<int64_t>(tasks.size()), ws + layout.scratch,
                      layout.layout.thread_stride(), claims_ahead,
                      [&](int64_t t, int64_t u, bool claimed, std::byte* scratch) {
                        NextDecodeTask next;
                        if (u >= 0) next = {plan.work.data() + tasks[u].first, tasks[u].heads};
                        kernel(p, plan.work.data() + tasks[t].first, tasks[t].heads, claimed, next,
                               scratch);
                      });
  // Each split (request, KV head): its group's rows merged, the sink joining, then stored.
  merge_splits(
      plan, p.partial, [&](const WorkItem&) { return p.group; },
      [&](const WorkItem& w, int64_t g) {
        return p.sinks ? p.sinks + w.kv_head * p.group + g : nullptr;
      },
      [&](const WorkItem& w, int64_t g, const float* o, float lse) {
        p.output.store(w.request, w.kv_head * p.group + static_cast<int>(g), o, p.head_dim_vo,
                       lse);
      });
  return Status::Ok();
}

}  // namespace kvattn::cpu
