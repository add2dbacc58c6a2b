// Planning and running the CPU prefill: cuts (request, KV head, query tile) work items, lays out
// the workspace, fills PrefillParams and runs the items on the thread pool with the kernel of
// the ISA level in effect.
#include "cpu/prefill/prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/backend.h"
#include "core/cpu_features.h"
#include "core/math_constants.h"
#include "core/paged_kv.h"
#include "core/status_macros.h"
#include "cpu/common/driver.h"
#include "cpu/decode/decode.h"
#include "cpu/kernel_table.h"
#include "cpu/prefill/params.h"
#include "cpu/prefill/tile_config.h"

namespace kvattn::cpu {
namespace {

using prefill::PrefillParams;
using prefill::PrefillTile;
using prefill::RequestInfo;
using prefill::ScratchLayout;

constexpr double kLog2e = math::kLog2eF64;

// The tile of the plan's kernel (its policy), which the strided fallback runs with too, cut to
// the longest request's query tokens where all are shorter (each request is then one tile, and
// the scratch holds only the rows they fill).
Status tile_of(const Problem& p, const std::string& kernel, const std::vector<int64_t>& qo_len,
               PrefillTile* tile) {
  const CpuKernel* k = nullptr;
  KVATTN_RETURN_IF_ERROR(planned_cpu_kernel(kernel, KernelOp::kPrefill, &k));
  *tile = prefill::prefill_tile(p.group_size(), p.head_dim_qk, p.head_dim_vo, k->tile);
  const int64_t longest = qo_len.empty() ? 1 : *std::max_element(qo_len.begin(), qo_len.end());
  if (longest < tile->tokens) {
    tile->tokens = static_cast<int>(std::max<int64_t>(longest, 1));
    tile->rows = tile->tokens * p.group_size();
    tile->rows_pad = prefill::row_pitch(tile->rows);
  }
  return Status::Ok();
}

bool uses_rope(const Problem& p) { return p.pos_encoding_mode == PosEncoding::kRopeLlama; }

// The absolute positions RoPE needs a table for: queries sit at kv_len - qo_len + i (negative
// when qo_len > kv_len), keys at j.
struct PositionRange {
  int64_t begin = 0, end = 0;
};
PositionRange rope_positions(const std::vector<int64_t>& qo_len,
                             const std::vector<int64_t>& kv_len) {
  PositionRange r;
  for (std::size_t b = 0; b < qo_len.size(); ++b) {
    r.begin = std::min(r.begin, kv_len[b] - qo_len[b]);
    r.end = std::max(r.end, kv_len[b]);
  }
  return r;
}

// The workspace (common/driver.h): request table, ALiBi slopes, sinks, per-head scales, RoPE
// table, then one scratch per thread.
struct PrefillWorkspace {
  std::size_t requests = 0, slopes = 0, sinks = 0, head_scales = 0, rope = 0, scratch = 0;
  WorkspaceLayout layout;

  PrefillWorkspace(const Problem& p, const PrefillTile& tile, const std::vector<int64_t>& qo_len,
                   const std::vector<int64_t>& kv_len, int num_threads, int task_heads) {
    requests = layout.take(sizeof(RequestInfo) * qo_len.size());
    slopes = layout.take(sizeof(float) * p.num_qo_heads);
    sinks = layout.take(sizeof(float) * p.num_qo_heads);
    head_scales = layout.take(sizeof(float) * 2 * p.num_kv_heads);  // K then V
    if (uses_rope(p)) {
      const PositionRange pos = rope_positions(qo_len, kv_len);
      rope = layout.take(sizeof(float) * (pos.end - pos.begin) * (p.head_dim_qk / 2) * 2);
    }
    const ScratchLayout s = prefill::scratch_layout(tile, p.head_dim_qk, p.head_dim_vo, task_heads);
    scratch = layout.take_per_thread(sizeof(float) * s.floats, num_threads);
  }
};

int64_t read_index(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

// The keys a tile of query tokens [t0, t1) can see (for cost and the plan's kv range).
void visible_keys(const Problem& p, int64_t qo_len, int64_t kv_len, int64_t t0, int64_t t1,
                  int64_t* begin, int64_t* end) {
  const int64_t offset = kv_len - qo_len;
  *begin = 0;
  *end = kv_len;
  if (p.mask_mode == MaskMode::kCausal) *end = std::clamp<int64_t>(t1 - 1 + offset + 1, 0, kv_len);
  if (p.window_left >= 0) *begin = std::clamp<int64_t>(t0 + offset - p.window_left, 0, kv_len);
  if (*end < *begin) *end = *begin;
}

void fill_rope_table(const Problem& p, const PositionRange& pos, float* table, int num_threads) {
  const int half = p.head_dim_qk / 2;
  std::vector<double> inv_freq(half);
  for (int t = 0; t < half; ++t) {
    inv_freq[t] = std::pow(static_cast<double>(p.rope_theta), -2.0 * t / p.head_dim_qk);
  }
  const int64_t count = pos.end - pos.begin;
  ThreadPool::global().parallel_for(num_threads, count, [&](int64_t i, int) {
    const double position = static_cast<double>(pos.begin + i) / p.rope_scale;
    float* row = table + i * 2 * half;
    for (int t = 0; t < half; ++t) {
      const double angle = position * inv_freq[t];
      row[2 * t] = static_cast<float>(std::cos(angle));
      row[2 * t + 1] = static_cast<float>(std::sin(angle));
    }
  });
}

// Whether the prefill kernels read this run's q, K and V rows at unit stride (the bf16
// dot-product kernel needs it; the others take any stride).
bool unit_stride_rows(const PrefillParams& params) {
  return params.q_stride_dim == 1 && params.k.strides.dim == 1 && params.v.strides.dim == 1;
}

// Work items of tiles of `tile.tokens` queries: one per (request, KV head, query tile).
int64_t count_items(const Problem& p, const PrefillTile& tile, const std::vector<int64_t>& qo_len) {
  int64_t tiles = 0;
  for (int64_t q : qo_len) tiles += (q + tile.tokens - 1) / tile.tokens;
  return tiles * p.num_kv_heads;
}

// Whether each token's K rows of consecutive KV heads lie side by side, and its V rows likewise
// (NHD, unit-stride rows): a task's heads are then read as one run a token.
bool heads_adjacent(const PrefillParams& params) {
  return unit_stride_rows(params) && params.k.strides.head == params.head_dim_qk &&
         params.v.strides.head == params.head_dim_vo;
}

// A batch prefill over a paged cache whose every request has one query token (qo_indptr is then
// 0, 1, ..., B: token b is request b's) is a decode: that query sits at the last position and
// sees what a decode's does (causal or not; the window, RoPE and ALiBi positions; the custom
// mask's bits laid out alike, kv_len a request).
bool one_token_each(const Problem& p, const std::vector<int64_t>& qo_len) {
  return p.op == Op::kBatchPrefillPaged && !qo_len.empty() &&
         std::all_of(qo_len.begin(), qo_len.end(), [](int64_t n) { return n == 1; });
}

// The decode problem such a prefill is.
Problem as_decode(const Problem& p) {
  Problem d = p;
  d.op = Op::kBatchDecode;
  if (d.mask_mode == MaskMode::kCausal) d.mask_mode = MaskMode::kNone;
  return d;
}

}  // namespace

Status one_token_cpu_kernel(const Problem& problem, CpuIsa isa, const CpuKernel** kernel) {
  *kernel = nullptr;
  if (problem.op != Op::kBatchPrefillPaged || cpu_kernel_forced(KernelOp::kPrefill)) {
    return Status::Ok();
  }
  return choose_cpu_kernel(as_decode(problem), isa, kernel);
}

int prefill_task_heads(const Problem& problem, const PrefillTile& tile, int64_t items,
                       int threads) {
  if (problem.kv_layout != KVLayout::kNHD) return 1;
  if (tile.rows > kPrefillHeadTaskRows) return 1;
  const ScratchLayout s = prefill::scratch_layout(tile, problem.head_dim_qk, problem.head_dim_vo);
  int heads = std::min(problem.num_kv_heads, prefill::kPrefillMaxTaskHeads);
  while (heads > 1 &&
         (items / heads < kPrefillTasksPerThread * threads ||
          int64_t{sizeof(float)} * s.head_slot * (heads - 1) > kPrefillTileScratchBytes)) {
    heads /= 2;
  }
  return heads;
}

const CpuKernel& prefill_kernel_for_lengths(const Problem& problem, const CpuKernel& chosen,
                                            const std::vector<int64_t>& qo_len, int threads) {
  const CpuKernel* best = &chosen;
  const int64_t longest = qo_len.empty() ? 0 : *std::max_element(qo_len.begin(), qo_len.end());
  for (const CpuKernel* k : taller_cpu_kernels(chosen)) {
    // No request fills more rows than the tile it has: a taller one would add nothing.
    const PrefillTile shorter = prefill::prefill_tile(problem.group_size(), problem.head_dim_qk,
                                                      problem.head_dim_vo, best->tile);
    if (longest <= shorter.tokens) break;
    const PrefillTile tile = prefill::prefill_tile(problem.group_size(), problem.head_dim_qk,
                                                   problem.head_dim_vo, k->tile);
    const ScratchLayout s = prefill::scratch_layout(tile, problem.head_dim_qk, problem.head_dim_vo);
    if (int64_t{sizeof(float)} * s.floats > kPrefillTileScratchBytes) break;
    // A tile computes the keys of its whole span (its first row's window to its last row's
    // diagonal): under a sliding window, a row sees window_left + 1 of them.
    if (problem.window_left >= 0 &&
        int64_t{tile.tokens} * kPrefillWindowPerTileToken > problem.window_left + 1) {
      break;
    }
    if (count_items(problem, tile, qo_len) < kPrefillItemsPerThread * threads) break;
    best = k;
  }
  return *best;
}

Status plan_prefill(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                    Plan* plan) {
  // The output dtype (f32/f16/bf16: the cpu declaration's o dtypes) and an even head_dim_qk
  // under RoPE (validate_problem) were checked before any backend plans.
  request_lengths(problem, args, &plan->qo_len, &plan->kv_len);
  const int threads = resolve_num_threads(options.num_threads);
  if (one_token_each(problem, plan->qo_len)) {
    // A decode (one_token_each): the decode path's kernel and cut, whose tasks read each token's
    // rows of all KV heads together and whose kernels' rows are a GQA group, not a 16-row
    // vector of a few rows (one token a request, B16 x 4096 keys, GQA 32/8 bf16 on Zen 4: 12.8
    // against 23.8 ms on the prefill's tiles).
    const CpuKernel* k = nullptr;
    KVATTN_RETURN_IF_ERROR(one_token_cpu_kernel(problem, plan_isa(plan->device), &k));
    if (k != nullptr) {
      plan->kernel = std::string(k->name);
      return plan_decode(as_decode(problem), args, options, plan);
    }
  }
  if (!cpu_kernel_forced(KernelOp::kPrefill)) {
    const CpuKernel* chosen = nullptr;
    KVATTN_RETURN_IF_ERROR(planned_cpu_kernel(plan->kernel, KernelOp::kPrefill, &chosen));
    plan->kernel =
        std::string(prefill_kernel_for_lengths(problem, *chosen, plan->qo_len, threads).name);
  }
  PrefillTile tile;
  KVATTN_RETURN_IF_ERROR(tile_of(problem, plan->kernel, plan->qo_len, &tile));

  // One item per (request, KV head, query tile), costliest first: the pool hands items out in
  // order, so the long causal tiles at the bottom of each request start early and the short ones
  // fill the gaps at the end.
  struct Costed {
    WorkItem item;
    int64_t cost;
  };
  std::vector<Costed> items;
  for (int b = 0; b < problem.batch_size; ++b) {
    const int64_t qo_len = plan->qo_len[b], kv_len = plan->kv_len[b];
    for (int64_t t0 = 0; t0 < qo_len; t0 += tile.tokens) {
      const int64_t t1 = std::min<int64_t>(t0 + tile.tokens, qo_len);
      int64_t kv_begin, kv_end;
      visible_keys(problem, qo_len, kv_len, t0, t1, &kv_begin, &kv_end);
      // Staging the queries and writing the output cost about as much as a few keys.
      const int64_t cost = (t1 - t0) * (kv_end - kv_begin + 8);
      for (int h = 0; h < problem.num_kv_heads; ++h) {
        WorkItem w;
        w.request = b;
        w.kv_head = h;
        w.qo_begin = static_cast<int32_t>(t0);
        w.qo_end = static_cast<int32_t>(t1);
        w.kv_begin = kv_begin;
        w.kv_end = kv_end;
        items.push_back({w, cost});
      }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Costed& a, const Costed& b) { return a.cost > b.cost; });
  plan->work.clear();
  plan->work.reserve(items.size());
  for (const Costed& c : items) plan->work.push_back(c.item);

  plan->num_threads =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, plan->work.size())));
  plan->kv_chunk_size = 0;
  plan->num_partial_states = 0;
  const int task_heads =
      prefill_task_heads(problem, tile, static_cast<int64_t>(plan->work.size()), plan->num_threads);
  plan->workspace_bytes =
      PrefillWorkspace(problem, tile, plan->qo_len, plan->kv_len, plan->num_threads, task_heads)
          .layout.bytes();
  return Status::Ok();
}

Status run_prefill(const Plan& plan, const AttentionArgs& args, void* workspace,
                   std::size_t workspace_bytes) {
  const Problem& p = plan.problem;
  const CpuKernel* decode = find_cpu_kernel(plan.kernel);
  if (decode != nullptr && decode->op == KernelOp::kDecode) {
    return run_decode(plan, as_decode(p), args, workspace, workspace_bytes);
  }
  PrefillParams params;
  KVATTN_RETURN_IF_ERROR(tile_of(p, plan.kernel, plan.qo_len, &params.tile));
  const int task_heads =
      prefill_task_heads(p, params.tile, static_cast<int64_t>(plan.work.size()), plan.num_threads);
  const PrefillWorkspace layout(p, params.tile, plan.qo_len, plan.kv_len, plan.num_threads,
                                task_heads);
  std::byte* base = nullptr;
  KVATTN_RETURN_IF_ERROR(
      bind_workspace("prefill", layout.layout, workspace, workspace_bytes, &base));

  params.scratch = prefill::scratch_layout(params.tile, p.head_dim_qk, p.head_dim_vo, task_heads);
  params.prefetch_l1 = detail::cpu_features().amd;

  const int batch = static_cast<int>(plan.qo_len.size());
  auto* requests = reinterpret_cast<RequestInfo*>(base + layout.requests);
  const bool single = p.op == Op::kSinglePrefill;
  const bool paged = p.op == Op::kBatchPrefillPaged;
  int64_t mask_at = 0;
  for (int b = 0; b < batch; ++b) {
    RequestInfo r;
    r.qo_begin = single ? 0 : read_index(args.qo_indptr, b);
    r.qo_len = plan.qo_len[b];
    r.kv_len = plan.kv_len[b];
    if (p.op == Op::kBatchPrefillRagged) r.kv_token_begin = read_index(args.kv_indptr, b);
    if (paged) r.page_begin = read_index(args.kv_indptr, b);
    r.mask_begin = mask_at;
    const int64_t bits = r.qo_len * r.kv_len;
    mask_at += args.custom_mask_packed ? (bits + 7) / 8 : bits;
    requests[b] = r;
  }
  params.requests = requests;

  params.q = args.q.data;
  params.q_dtype = p.q_dtype;
  params.q_stride_token = args.q.strides[0];
  params.q_stride_head = args.q.strides[1];
  params.q_stride_dim = args.q.strides[2];
  params.output = OutputRows::of(args);

  params.kv_dtype = p.kv_dtype;
  params.paged = paged;
  auto source = [&](const TensorView& t) {
    return prefill::KVSource{t.data, paged::kv_strides(p, t)};
  };
  params.k = source(paged ? args.paged_k_cache : args.k);
  params.v = source(paged ? args.paged_v_cache : args.v);
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    // [P, page_size, H_kv] beside a paged cache (either layout); [kv_len or nnz, H_kv] else.
    auto scales = [&](const TensorView& t) {
      return prefill::KVSource{t.data, paged::scale_strides(p, t)};
    };
    params.k_token_scale = scales(args.k_scale_cache);
    params.v_token_scale = scales(args.v_scale_cache);
  }
  auto read_f32 = [](const TensorView& t, int64_t i) {
    return static_cast<const float*>(t.data)[i * t.strides[0]];
  };
  // Per-head scales: a per_head plan's, or this layer's on a per_tensor plan.
  if (!args.k_scale.empty()) {
    auto* head_scales = reinterpret_cast<float*>(base + layout.head_scales);
    for (int h = 0; h < p.num_kv_heads; ++h) {
      head_scales[h] = read_f32(args.k_scale, h);
      head_scales[p.num_kv_heads + h] = read_f32(args.v_scale, h);
    }
    params.k_head_scale = head_scales;
    params.v_head_scale = head_scales + p.num_kv_heads;
  }
  if (!args.sinks.empty()) {
    auto* sinks = reinterpret_cast<float*>(base + layout.sinks);
    for (int h = 0; h < p.num_qo_heads; ++h) sinks[h] = read_f32(args.sinks, h);
    params.sinks = sinks;
  }
  if (paged) {
    params.page_size = p.page_size;
    params.page_ids = static_cast<const int32_t*>(args.kv_indices.data);
    params.page_ids_stride = args.kv_indices.strides[0];
  }

  params.num_kv_heads = p.num_kv_heads;
  params.group = p.group_size();
  params.head_dim_qk = p.head_dim_qk;
  params.head_dim_vo = p.head_dim_vo;

  const double sm_scale = p.effective_sm_scale();
  const double cap = p.logits_soft_cap > 0.0f ? p.logits_soft_cap : 0.0;
  params.q_scale = args.scalars.q_scale;
  params.k_scale = args.scalars.k_scale;
  params.v_scale = args.scalars.v_scale;
  params.fp16_qk_reduction = p.use_fp16_qk_reduction;
  params.soft_cap = static_cast<float>(cap);
  params.cap_log2e = static_cast<float>(cap * kLog2e);
  // What multiplies the raw dot product before the soft cap's tanh (or, without one, what turns
  // it into a log2-domain score).
  const double before_cap = cap > 0.0 ? sm_scale / cap : sm_scale * kLog2e;
  params.qk_scale = p.use_fp16_qk_reduction ? 1.0f : static_cast<float>(before_cap);
  params.reduction_scale = static_cast<float>(before_cap);

  params.causal = p.mask_mode == MaskMode::kCausal;
  params.window_left = p.window_left;
  if (p.mask_mode == MaskMode::kCustom) {
    params.custom_mask = static_cast<const uint8_t*>(args.custom_mask.data);
    params.custom_mask_stride = args.custom_mask.strides[0];
    params.custom_mask_packed = args.custom_mask_packed;
  }
  if (p.pos_encoding_mode == PosEncoding::kAlibi) {
    auto* slopes = reinterpret_cast<float*>(base + layout.slopes);
    for (int h = 0; h < p.num_qo_heads; ++h) {
      const double slope =
          args.alibi_slopes.empty()
              ? alibi_slope(h, p.num_qo_heads)
              : static_cast<const float*>(args.alibi_slopes.data)[h * args.alibi_slopes.strides[0]];
      slopes[h] = static_cast<float>(slope * kLog2e);
    }
    params.alibi_slopes_log2e = slopes;
  }
  if (uses_rope(p)) {
    const PositionRange pos = rope_positions(plan.qo_len, plan.kv_len);
    auto* table = reinterpret_cast<float*>(base + layout.rope);
    fill_rope_table(p, pos, table, plan.num_threads);
    params.rope_table = table;
    params.rope_pos_begin = pos.begin;
    params.rope_interleave = p.rope_interleave;
  }

  const CpuKernel* planned = nullptr;
  KVATTN_RETURN_IF_ERROR(planned_cpu_kernel(plan.kernel, KernelOp::kPrefill, &planned));
  const CpuKernel& chosen = unit_stride_rows(params) ? *planned : strided_cpu_kernel(*planned);
  const prefill::PrefillItemFn kernel = chosen.prefill();
  if (kernel == nullptr) {
    return make_error(ErrorCode::kInternal, "cpu prefill: kernel ", chosen.name, " not built");
  }
  // Tasks: runs of up to task_heads items of one request and query range on consecutive KV heads
  // (the plan's order keeps a tile's heads together) where the rows of a token's heads lie side
  // by side; else one item each.
  const std::vector<HeadRun> tasks = head_runs(plan.work, heads_adjacent(params) ? task_heads : 1);
  for_each_item(plan.num_threads, static_cast<int64_t>(tasks.size()), base + layout.scratch,
                layout.layout.thread_stride(), [&](int64_t t, std::byte* scratch) {
                  kernel(params, plan.work.data() + tasks[t].first, tasks[t].heads,
                         reinterpret_cast<float*>(scratch));
                });
  return Status::Ok();
}

}  // namespace kvattn::cpu
