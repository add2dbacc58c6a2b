// Decode planning (the split-KV decision), the run driver and the merge of split requests.
#include "cpu/decode/decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/numeric.h"
#include "core/run_scalars.h"
#include "core/status_macros.h"
#include "cpu/common/split_merge.h"
#include "cpu/common/thread_pool.h"
#include "cpu/kernel_table.h"

namespace kvattn::cpu {
namespace {

// Below this many keys per chunk the merge and the per-item prologue cost more than the
// parallelism gains.
constexpr int64_t kMinAutoChunk = 256;
// Tasks per thread the automatic split aims for, so that dynamic scheduling can even out tasks
// of different lengths.
constexpr int64_t kTasksPerThread = 4;

std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int pad_to(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// The keys query position kv_len - 1 can see at all: [lo, kv_len).
int64_t first_visible_key(const Problem& problem, int64_t kv_len) {
  if (problem.window_left < 0) return 0;
  return std::max<int64_t>(0, kv_len - 1 - problem.window_left);
}

// Workspace of a decode run: partial states of split items, per-request mask offsets, ALiBi
// slopes, then one scratch per thread. One function for the size and the layout.
struct DecodeWorkspaceLayout {
  std::size_t partial_o = 0, partial_lse = 0, mask_begin = 0, alibi = 0, sinks = 0, k_head = 0,
              v_head = 0, scratch = 0;
  std::size_t scratch_bytes = 0, bytes = 0;

  static DecodeWorkspaceLayout make(const Problem& problem, int64_t num_partial, int threads) {
    DecodeWorkspaceLayout l;
    const int group = problem.group_size();
    std::size_t at = 0;
    auto take = [&](std::size_t bytes) {
      const std::size_t begin = at;
      at = align_up(at + bytes, 64);
      return begin;
    };
    l.partial_o = take(sizeof(float) * num_partial * group * problem.head_dim_vo);
    l.partial_lse = take(sizeof(float) * num_partial * group);
    l.mask_begin = take(sizeof(int64_t) * problem.batch_size);
    l.alibi = take(sizeof(float) * problem.num_qo_heads);
    l.sinks = take(sizeof(float) * problem.num_qo_heads);
    l.k_head = take(sizeof(float) * problem.num_kv_heads);
    l.v_head = take(sizeof(float) * problem.num_kv_heads);
    l.scratch_bytes = DecodeScratchLayout::make(
                          decode_padded_group(group), pad_to(problem.head_dim_qk, kDecodeRowPad),
                          pad_to(problem.head_dim_vo, kDecodeRowPad),
                          problem.pos_encoding_mode == PosEncoding::kRopeLlama,
                          problem.kv_scale_granularity == KVScaleGranularity::kPerTokenHead)
                          .bytes;
    l.scratch = take(l.scratch_bytes * threads);
    l.bytes = at;
    return l;
  }
};

float read_f32(const TensorView& t, int64_t i) { return t.as<const float>()[i * t.strides[0]]; }

// Merges the partial states of one split (request, KV head): plan items `items`, in chunk order.
void merge_split(const Plan& plan, const DecodeParams& p, const std::vector<int64_t>& items) {
  const WorkItem& w0 = plan.work[items.front()];
  const int group = p.group, dvo = p.head_dim_vo;
  const int64_t o_bytes = static_cast<int64_t>(dtype_size(p.o_dtype));
  const int64_t count = static_cast<int64_t>(items.size());
  std::vector<float> merged(dvo);
  for (int g = 0; g < group; ++g) {
    const int qo_head = w0.kv_head * group + g;
    const float lse = merge_partial_states(
        count, dvo,
        [&](int64_t k) {
          const int64_t state = int64_t{plan.work[items[k]].partial} * group + g;
          return std::pair{p.partial_lse[state], p.partial_o + state * dvo};
        },
        p.sinks ? p.sinks + qo_head : nullptr, merged.data());
    std::byte* dst = p.out + (w0.request * p.o_stride_b + qo_head * p.o_stride_h) * o_bytes;
    for (int d = 0; d < dvo; ++d) {
      std::byte* e = dst + d * p.o_stride_d * o_bytes;
      if (p.o_dtype == DType::kF32) {
        std::memcpy(e, &merged[d], 4);
      } else {
        const uint16_t h =
            p.o_dtype == DType::kF16 ? num::f32_to_f16(merged[d]) : num::f32_to_bf16(merged[d]);
        std::memcpy(e, &h, 2);
      }
    }
    if (p.lse) {
      p.lse[w0.request * p.lse_stride_b + qo_head * p.lse_stride_h] = lse * p.lse_scale;
    }
  }
}

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
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t begin = at;
    at = align_up(at + bytes, 64);
    return begin;
  };
  const int heads = kDecodeMaxTaskHeads;
  l.q = take(sizeof(float) * heads * group_padded * head_dim_qk_padded);
  l.o = take(sizeof(float) * heads * group_padded * head_dim_vo_padded);
  l.scores = take(sizeof(float) * group_padded * kDecodeTileKeys);
  l.max = take(sizeof(float) * heads * group_padded);
  l.sum = take(sizeof(float) * heads * group_padded);
  l.k_rows = take(sizeof(void*) * 2 * kDecodeTileKeys);
  l.v_rows = take(sizeof(void*) * 2 * kDecodeTileKeys);
  l.head_rows = take(sizeof(void*) * 2 * kDecodeTileKeys);
  l.mask = take(kDecodeTileKeys);
  l.nan_key = take(kDecodeMaxTaskHeads);
  if (token_scales) {
    l.scale_offsets = take(sizeof(int64_t) * 2 * 2 * kDecodeTileKeys);  // [K, V][2][tile]
    l.token_scales = take(sizeof(float) * 2 * kDecodeTileKeys);         // [K, V][tile]
  }
  if (rope) {
    l.rope_k = take(sizeof(float) * kDecodeTileKeys * head_dim_qk_padded);
    l.rope_cos_sin = take(sizeof(double) * 5 * (head_dim_qk_padded / 2));
  }
  l.bytes = at;
  return l;
}

Status plan_decode(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                   Plan* plan) {
  plan->backend = "cpu";
  plan->device = options.device;
  plan->problem = problem;
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
    const int64_t tasks = int64_t{batch} * ceil_div(heads, kDecodeMaxTaskHeads);
    const int64_t target = kTasksPerThread * threads;
    if (threads > 1 && tasks < target) {
      const int64_t pieces = ceil_div(target, tasks);
      chunk = std::max(kMinAutoChunk,
                       ceil_div(ceil_div(max_len, pieces), kDecodeTileKeys) * kDecodeTileKeys);
      if (chunk >= max_len) chunk = 0;
    }
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
  plan->workspace_bytes = DecodeWorkspaceLayout::make(problem, partial, threads).bytes;
  return Status::Ok();
}

Status run_decode(const Plan& plan, const AttentionArgs& args, void* workspace,
                  std::size_t workspace_bytes) {
  const Problem& pb = plan.problem;
  const DecodeWorkspaceLayout layout =
      DecodeWorkspaceLayout::make(pb, plan.num_partial_states, plan.num_threads);
  if (workspace_bytes < layout.bytes || (layout.bytes > 0 && workspace == nullptr)) {
    return make_error(ErrorCode::kInvalidArgument, "cpu decode: workspace of ", workspace_bytes,
                      " bytes, the plan needs ", layout.bytes);
  }
  auto* ws = static_cast<std::byte*>(workspace);
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
  p.o_dtype = pb.o_dtype;

  p.q = static_cast<const std::byte*>(args.q.data);
  p.q_stride_b = single ? 0 : args.q.strides[0];
  p.q_stride_h = args.q.strides[single ? 0 : 1];
  p.q_stride_d = args.q.strides[single ? 1 : 2];
  p.out = static_cast<std::byte*>(args.out.data);
  p.o_stride_b = single ? 0 : args.out.strides[0];
  p.o_stride_h = args.out.strides[single ? 0 : 1];
  p.o_stride_d = args.out.strides[single ? 1 : 2];
  if (!args.lse.empty()) {
    p.lse = args.lse.as<float>();
    p.lse_scale = lse_store_scale(args.scalars);
    p.lse_stride_b = single ? 0 : args.lse.strides[0];
    p.lse_stride_h = args.lse.strides[single ? 0 : 1];
  }

  static const int32_t kSinglePageIndptr[2] = {0, 1};
  static const int32_t kSinglePage[1] = {0};
  const bool nhd = pb.kv_layout == KVLayout::kNHD;
  if (single) {
    const TensorView &k = args.k, &v = args.v;
    p.k = static_cast<const std::byte*>(k.data);
    p.v = static_cast<const std::byte*>(v.data);
    p.k_token_stride = k.strides[nhd ? 0 : 1];
    p.k_head_stride = k.strides[nhd ? 1 : 0];
    p.k_elem_stride = k.strides[2];
    p.v_token_stride = v.strides[nhd ? 0 : 1];
    p.v_head_stride = v.strides[nhd ? 1 : 0];
    p.v_elem_stride = v.strides[2];
    p.page_size = std::max<int64_t>(plan.kv_len[0], 1);
    p.kv_indptr = kSinglePageIndptr;
    p.kv_indices = kSinglePage;
  } else {
    const TensorView &k = args.paged_k_cache, &v = args.paged_v_cache;
    p.k = static_cast<const std::byte*>(k.data);
    p.v = static_cast<const std::byte*>(v.data);
    p.k_page_stride = k.strides[0];
    p.k_token_stride = k.strides[nhd ? 1 : 2];
    p.k_head_stride = k.strides[nhd ? 2 : 1];
    p.k_elem_stride = k.strides[3];
    p.v_page_stride = v.strides[0];
    p.v_token_stride = v.strides[nhd ? 1 : 2];
    p.v_head_stride = v.strides[nhd ? 2 : 1];
    p.v_elem_stride = v.strides[3];
    p.page_size = pb.page_size;
    p.kv_indptr = args.kv_indptr.as<const int32_t>();
    p.indptr_stride = args.kv_indptr.strides[0];
    p.kv_indices = args.kv_indices.as<const int32_t>();
    p.indices_stride = args.kv_indices.rank > 0 ? args.kv_indices.strides[0] : 1;
  }
  p.kv_len = plan.kv_len.data();

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
    const TensorView &ks = args.k_scale_cache, &vs = args.v_scale_cache;
    p.k_token_scale = ks.as<const float>();
    p.v_token_scale = vs.as<const float>();
    const int r = single ? 0 : 1;
    p.ks_page_stride = single ? 0 : ks.strides[0];
    p.ks_token_stride = ks.strides[r];
    p.ks_head_stride = ks.strides[r + 1];
    p.vs_page_stride = single ? 0 : vs.strides[0];
    p.vs_token_stride = vs.strides[r];
    p.vs_head_stride = vs.strides[r + 1];
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
  p.partial_o = reinterpret_cast<float*>(ws + layout.partial_o);
  p.partial_lse = reinterpret_cast<float*>(ws + layout.partial_lse);

  // The plan's kernel (kernel_table.h); the vector ones need unit-stride K/V rows.
  const CpuKernel* planned = nullptr;
  KVATTN_RETURN_IF_ERROR(planned_cpu_kernel(plan.kernel, KernelOp::kDecode, &planned));
  const bool contiguous = p.k_elem_stride == 1 && p.v_elem_stride == 1;
  const CpuKernel& chosen = contiguous ? *planned : strided_cpu_kernel(*planned);
  DecodeItemFn kernel = chosen.decode(pb, p.group_padded);
  if (!kernel) {
    return make_error(ErrorCode::kInternal, "cpu decode: no kernel for kv ",
                      dtype_name(pb.kv_dtype), ", head dims ", pb.head_dim_qk, "/", pb.head_dim_vo,
                      ", group ", p.group);
  }
  // Tasks: runs of consecutive items of one request and KV range on consecutive heads (one head
  // each under fused RoPE, whose per-tile tables are per head).
  const int max_task_heads = p.rope ? 1 : kDecodeMaxTaskHeads;
  std::vector<std::pair<int64_t, int>> tasks;  // first item, heads
  const int64_t num_items = static_cast<int64_t>(plan.work.size());
  for (int64_t i = 0; i < num_items;) {
    const WorkItem& w = plan.work[i];
    int count = 1;
    while (count < max_task_heads && i + count < num_items) {
      const WorkItem& x = plan.work[i + count];
      if (x.request != w.request || x.kv_begin != w.kv_begin || x.kv_end != w.kv_end ||
          x.kv_head != w.kv_head + count) {
        break;
      }
      ++count;
    }
    tasks.emplace_back(i, count);
    i += count;
  }
  std::byte* scratch = ws + layout.scratch;
  ThreadPool::global().parallel_for(plan.num_threads, static_cast<int64_t>(tasks.size()),
                                    [&](int64_t t, int thread_id) {
                                      kernel(p, plan.work.data() + tasks[t].first, tasks[t].second,
                                             scratch + layout.scratch_bytes * thread_id);
                                    });

  if (plan.num_partial_states > 0) {
    // The partial states of each split (request, KV head), in chunk order.
    std::vector<std::vector<int64_t>> splits;
    std::vector<int64_t> split_of(int64_t{pb.batch_size} * pb.num_kv_heads, -1);
    for (int64_t i = 0; i < num_items; ++i) {
      const WorkItem& w = plan.work[i];
      if (w.partial < 0) continue;
      int64_t& s = split_of[int64_t{w.request} * pb.num_kv_heads + w.kv_head];
      if (s < 0) {
        s = static_cast<int64_t>(splits.size());
        splits.emplace_back();
      }
      splits[s].push_back(i);
    }
    ThreadPool::global().parallel_for(plan.num_threads, static_cast<int64_t>(splits.size()),
                                      [&](int64_t s, int) { merge_split(plan, p, splits[s]); });
  }
  return Status::Ok();
}

}  // namespace kvattn::cpu
