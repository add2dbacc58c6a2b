// The CPU MLA path: planning (items of query tokens x key chunks), running them on the thread
// pool, merging split-KV partial states, and the portable f32 item kernel.
#include "cpu/mla/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/element_io.h"
#include "core/math_constants.h"
#include "core/numeric.h"
#include "core/run_scalars.h"
#include "core/split_kv.h"
#include "core/status_macros.h"
#include "cpu/common/split_merge.h"
#include "cpu/common/thread_pool.h"
#include "cpu/kernel_table.h"

namespace kvattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using math::kLn2;
using math::kLog2e;
// Split only into chunks of at least this many keys: a smaller chunk costs more to merge
// (128 rows x D_ckv per state) than it saves.
constexpr int64_t kMinAutoChunk = 512;
// Items per thread the automatic split aims at, so that uneven items still balance.
constexpr int64_t kItemsPerThread = 4;
constexpr std::size_t kAlign = 64;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

using io::load_f32;
using io::store_f32;

// Workspace: the partial states (each kMlaMaxRows rows of D_ckv outputs and their lse), then
// each thread's item output and kernel scratch. One function for the size and the layout.
struct MlaWorkspaceLayout {
  std::size_t state_floats = 0, partial_bytes = 0, item_bytes = 0, kernel_bytes = 0,
              thread_bytes = 0, bytes = 0;
  static MlaWorkspaceLayout make(const Problem& p, int64_t partial_states, int threads) {
    MlaWorkspaceLayout l;
    l.state_floats = static_cast<std::size_t>(kMlaMaxRows) * (p.head_dim_ckv + 1);
    l.partial_bytes = align_up(static_cast<std::size_t>(partial_states) * l.state_floats * 4);
    l.item_bytes = align_up(l.state_floats * 4);
    l.kernel_bytes =
        align_up(mla_kernel_scratch_bytes(p.num_qo_heads, p.head_dim_ckv, p.head_dim_kpe));
    l.thread_bytes = l.item_bytes + l.kernel_bytes;
    l.bytes = l.partial_bytes + static_cast<std::size_t>(threads) * l.thread_bytes + kAlign;
    return l;
  }
};

MlaParams make_params(const Problem& pb, const AttentionArgs& a,
                      const std::vector<int64_t>& qo_begin, const Plan& plan) {
  MlaParams p;
  p.heads = pb.num_qo_heads;
  p.d_ckv = pb.head_dim_ckv;
  p.d_kpe = pb.head_dim_kpe;
  p.q_dtype = pb.q_dtype;
  p.kv_dtype = pb.kv_dtype;
  p.kv_elem_bytes = static_cast<int64_t>(dtype_size(pb.kv_dtype));
  p.q_nope = static_cast<const std::byte*>(a.q_nope.data);
  p.qn_row = a.q_nope.strides[0];
  p.qn_head = a.q_nope.strides[1];
  p.qn_dim = a.q_nope.strides[2];
  p.q_pe = static_cast<const std::byte*>(a.q_pe.data);
  p.qp_row = a.q_pe.strides[0];
  p.qp_head = a.q_pe.strides[1];
  p.qp_dim = a.q_pe.strides[2];
  p.ckv = static_cast<const std::byte*>(a.ckv_cache.data);
  p.ckv_page = a.ckv_cache.strides[0];
  p.ckv_slot = a.ckv_cache.strides[1];
  p.ckv_dim = a.ckv_cache.strides[2];
  p.kpe = static_cast<const std::byte*>(a.kpe_cache.data);
  p.kpe_page = a.kpe_cache.strides[0];
  p.kpe_slot = a.kpe_cache.strides[1];
  p.kpe_dim = a.kpe_cache.strides[2];
  p.kv_indptr = static_cast<const int32_t*>(a.kv_indptr.data);
  p.indptr_stride = a.kv_indptr.strides[0];
  p.kv_indices = static_cast<const int32_t*>(a.kv_indices.data);
  p.indices_stride = a.kv_indices.strides[0];
  p.page_size = pb.page_size;
  p.qo_begin = qo_begin.data();
  p.qo_len = plan.qo_len.data();
  p.kv_len = plan.kv_len.data();
  p.causal = pb.mask_mode == MaskMode::kCausal;
  p.score_scale_log2 = *pb.sm_scale * a.scalars.k_scale * kLog2e;
  p.k_scale = a.scalars.k_scale;
  return p;
}

// The last key query token i of request b sees, plus one (causal, bottom-right aligned).
int64_t visible_end(const MlaParams& p, int b, int64_t i) {
  if (!p.causal) return p.kv_len[b];
  return std::clamp<int64_t>(i + p.kv_len[b] - p.qo_len[b] + 1, 0, p.kv_len[b]);
}

// Writes the rows of a finished item (or merged state) to out / lse.
void store_rows(const Problem& pb, const AttentionArgs& a, int64_t first_row, int64_t tokens,
                const float* o, const float* lse) {
  auto* out = static_cast<std::byte*>(a.out.data);
  const int heads = pb.num_qo_heads, d_ckv = pb.head_dim_ckv;
  const float lse_scale = lse_store_scale(a.scalars);  // partial states stay natural
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const int64_t r = t * heads + h;
      const int64_t base = (first_row + t) * a.out.strides[0] + h * a.out.strides[1];
      const float* src = o + r * d_ckv;
      // Unit-stride bf16 / f32 rows (the usual output) in a plain loop the compiler vectorizes:
      // the per-element dtype switch took ~10 % of a DeepSeek-V3 decode step.
      if (a.out.strides[2] == 1 && pb.o_dtype == DType::kBF16) {
        uint16_t* dst = reinterpret_cast<uint16_t*>(out) + base;
        for (int d = 0; d < d_ckv; ++d) dst[d] = num::f32_to_bf16(src[d]);
      } else if (a.out.strides[2] == 1 && pb.o_dtype == DType::kF32) {
        std::memcpy(reinterpret_cast<float*>(out) + base, src, sizeof(float) * d_ckv);
      } else {
        for (int d = 0; d < d_ckv; ++d) {
          store_f32(out, pb.o_dtype, base + d * a.out.strides[2], src[d]);
        }
      }
      if (!a.lse.empty()) {
        static_cast<float*>(a.lse.data)[(first_row + t) * a.lse.strides[0] + h * a.lse.strides[1]] =
            lse[r] * lse_scale;
      }
    }
  }
}

}  // namespace

std::size_t mla_kernel_scratch_bytes(int heads, int d_ckv, int d_kpe) {
  const std::size_t rows = kMlaMaxRows, dqk = static_cast<std::size_t>(d_ckv + d_kpe);
  (void)heads;
  // The larger of the two kernels' needs (mla_avx512_bf16.cc lays its scratch out inside this):
  // packed queries, scores, packed probabilities, packed values, a bf16 tile copy with a zero
  // row, accumulators and the running max / sum / rescale of every row.
  std::size_t bytes = 0;
  bytes += align_up(rows * dqk * 4);                    // q (f32) or q pairs
  bytes += align_up(rows * kMlaTileKeys * 4);           // scores / probabilities
  bytes += align_up(rows * kMlaTileKeys * 4);           // probability pairs
  bytes += align_up(kMlaTileKeys * dqk * 4 + dqk * 4);  // tile (f32 or bf16) + zero row
  bytes += align_up(kMlaTileKeys * static_cast<std::size_t>(d_ckv) * 4);  // packed values
  bytes += align_up(rows * static_cast<std::size_t>(d_ckv) * 4);          // accumulators
  bytes += 3 * align_up(rows * 4);                                        // max, sum, rescale
  return bytes;
}

void mla_item_portable(const MlaParams& p, const WorkItem& w, float* o, float* lse,
                       std::byte* scratch) {
  const int heads = p.heads, d_ckv = p.d_ckv, dqk = p.d_ckv + p.d_kpe;
  const int b = w.request;
  const int64_t tokens = w.qo_end - w.qo_begin, rows = tokens * heads;
  auto* q = reinterpret_cast<float*>(scratch);    // [rows][dqk]
  float* tile = q + rows * dqk;                   // [T][dqk] real
  float* m = tile + int64_t{kMlaTileKeys} * dqk;  // [rows]
  float* l = m + rows;                            // [rows]
  float* s = l + rows;                            // [T]
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t qrow = p.qo_begin[b] + w.qo_begin + t;
    for (int h = 0; h < heads; ++h) {
      float* qr = q + (t * heads + h) * dqk;
      for (int d = 0; d < p.d_ckv; ++d) {
        qr[d] = load_f32(p.q_nope, p.q_dtype, qrow * p.qn_row + h * p.qn_head + d * p.qn_dim);
      }
      for (int d = 0; d < p.d_kpe; ++d) {
        qr[d_ckv + d] = load_f32(p.q_pe, p.q_dtype, qrow * p.qp_row + h * p.qp_head + d * p.qp_dim);
      }
    }
  }
  std::fill(o, o + rows * d_ckv, 0.0f);
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.0f);
  for (int64_t j0 = w.kv_begin; j0 < w.kv_end; j0 += kMlaTileKeys) {
    const int n = static_cast<int>(std::min<int64_t>(kMlaTileKeys, w.kv_end - j0));
    for (int jj = 0; jj < n; ++jj) {
      const std::byte* c = p.ckv_row(b, j0 + jj);
      const std::byte* r = p.kpe_row(b, j0 + jj);
      float* row = tile + int64_t{jj} * dqk;
      for (int d = 0; d < d_ckv; ++d) row[d] = load_f32(c, p.kv_dtype, d * p.ckv_dim);
      for (int d = 0; d < p.d_kpe; ++d) row[d_ckv + d] = load_f32(r, p.kv_dtype, d * p.kpe_dim);
    }
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t end = visible_end(p, b, w.qo_begin + t);
      const int visible = static_cast<int>(std::clamp<int64_t>(end - j0, 0, n));
      if (visible == 0) continue;
      for (int h = 0; h < heads; ++h) {
        const int64_t r = t * heads + h;
        const float* qr = q + r * dqk;
        float mx = m[r];
        for (int jj = 0; jj < visible; ++jj) {
          const float* k = tile + int64_t{jj} * dqk;
          float dot = 0.0f;
          for (int d = 0; d < dqk; ++d) dot += qr[d] * k[d];
          s[jj] = dot * p.score_scale_log2;
          mx = std::max(mx, s[jj]);
        }
        const float alpha = std::exp2(m[r] - mx);
        float* orow = o + r * d_ckv;
        for (int d = 0; d < d_ckv; ++d) orow[d] *= alpha;
        float sum = 0.0f;
        for (int jj = 0; jj < visible; ++jj) {
          const float prob = std::exp2(s[jj] - mx);
          sum += prob;
          const float* v = tile + int64_t{jj} * dqk;
          for (int d = 0; d < d_ckv; ++d) orow[d] += prob * v[d];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = mx;
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = l[r] > 0.0f ? p.k_scale / l[r] : 0.0f;
    for (int d = 0; d < d_ckv; ++d) o[r * d_ckv + d] *= scale;
    lse[r] = l[r] > 0.0f ? (m[r] + std::log2(l[r])) * kLn2 : kNegInf;
  }
}

Status plan_mla(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                Plan* plan) {
  plan->backend = "cpu";
  plan->device = options.device;
  plan->problem = problem;
  request_lengths(problem, args, &plan->qo_len, &plan->kv_len);
  const int threads = resolve_num_threads(options.num_threads);
  plan->num_threads = threads;
  const int batch = problem.batch_size;
  const int64_t per_item = mla_tokens_per_item(problem.num_qo_heads);

  int64_t chunk = options.kv_chunk_size;
  if (chunk == 0) {
    // Split only when the unsplit items cannot keep every thread busy (decode of a few long
    // requests); then cut the longest request into tile-aligned chunks.
    int64_t items = 0, longest = 0;
    for (int b = 0; b < batch; ++b) {
      items += ceil_div(plan->qo_len[b], per_item);
      longest = std::max(longest, plan->kv_len[b]);
    }
    const int64_t target = kItemsPerThread * threads;
    if (threads > 1 && items > 0 && items < target) {
      const int64_t pieces = ceil_div(target, items);
      chunk =
          std::max(kMinAutoChunk, ceil_div(ceil_div(longest, pieces), kMlaTileKeys) * kMlaTileKeys);
      if (chunk >= longest) chunk = 0;
    }
  }
  plan->kv_chunk_size = chunk;

  // Partial states of one (request, token block) are consecutive, in chunk order: run_mla merges
  // each such run.
  plan->work.clear();
  int64_t partial = 0;
  for (int b = 0; b < batch; ++b) {
    const int64_t kv_len = plan->kv_len[b];
    const int64_t chunks = split::num_chunks(kv_len, chunk);
    for (int64_t q0 = 0; q0 < plan->qo_len[b]; q0 += per_item) {
      for (int64_t c = 0; c < chunks; ++c) {
        const split::ChunkRange range = split::chunk_range(kv_len, chunk, c);
        WorkItem w;
        w.request = b;
        w.kv_head = 0;
        w.qo_begin = static_cast<int32_t>(q0);
        w.qo_end = static_cast<int32_t>(std::min(plan->qo_len[b], q0 + per_item));
        w.kv_begin = range.begin;
        w.kv_end = range.end;
        w.partial = chunks > 1 ? static_cast<int32_t>(partial++) : -1;
        plan->work.push_back(w);
      }
    }
  }
  plan->num_partial_states = partial;
  plan->workspace_bytes = MlaWorkspaceLayout::make(problem, partial, threads).bytes;
  return Status::Ok();
}

Status run_mla(const Plan& plan, const AttentionArgs& args, void* workspace,
               std::size_t workspace_bytes) {
  const Problem& pb = plan.problem;
  const MlaWorkspaceLayout layout =
      MlaWorkspaceLayout::make(pb, plan.num_partial_states, plan.num_threads);
  if (workspace_bytes < layout.bytes || (layout.bytes > 0 && workspace == nullptr)) {
    return make_error(ErrorCode::kInvalidArgument, "cpu mla: workspace of ", workspace_bytes,
                      " bytes, the plan needs ", layout.bytes);
  }
  auto addr = reinterpret_cast<std::uintptr_t>(workspace);
  auto* ws = static_cast<std::byte*>(workspace) + (kAlign - addr % kAlign) % kAlign;
  auto* partial = reinterpret_cast<float*>(ws);
  std::byte* thread_base = ws + layout.partial_bytes;

  std::vector<int64_t> qo_begin(pb.batch_size + 1, 0);
  for (int b = 0; b < pb.batch_size; ++b) qo_begin[b + 1] = qo_begin[b] + plan.qo_len[b];
  const MlaParams params = make_params(pb, args, qo_begin, plan);
  // The plan's kernel (kernel_table.h); a vector one returns nullptr on strided rows.
  const CpuKernel* planned = nullptr;
  KVATTN_RETURN_IF_ERROR(planned_cpu_kernel(plan.kernel, KernelOp::kMla, &planned));
  MlaItemFn kernel = planned->mla(params);
  if (!kernel) kernel = strided_cpu_kernel(*planned).mla(params);
  if (!kernel) {
    return make_error(ErrorCode::kInternal, "cpu mla: kernel ", planned->name, " found none");
  }

  const int heads = pb.num_qo_heads, d_ckv = pb.head_dim_ckv;
  ThreadPool::global().parallel_for(
      plan.num_threads, static_cast<int64_t>(plan.work.size()), [&](int64_t i, int thread) {
        const WorkItem& w = plan.work[i];
        std::byte* mine = thread_base + static_cast<std::size_t>(thread) * layout.thread_bytes;
        const int64_t rows = int64_t{w.qo_end - w.qo_begin} * heads;
        float* o = w.partial >= 0 ? partial + w.partial * layout.state_floats
                                  : reinterpret_cast<float*>(mine);
        float* lse = o + rows * d_ckv;
        kernel(params, w, o, lse, mine + layout.item_bytes);
        if (w.partial < 0) {
          store_rows(pb, args, qo_begin[w.request] + w.qo_begin, w.qo_end - w.qo_begin, o, lse);
        }
      });

  // Merge each run of partial states of one (request, token block).
  struct Run {
    std::size_t first_item;
    int count;
  };
  std::vector<Run> runs;
  for (std::size_t i = 0; i < plan.work.size(); ++i) {
    const WorkItem& w = plan.work[i];
    if (w.partial < 0) continue;
    const bool extends = !runs.empty() && plan.work[runs.back().first_item].request == w.request &&
                         plan.work[runs.back().first_item].qo_begin == w.qo_begin;
    if (extends) {
      ++runs.back().count;
    } else {
      runs.push_back({i, 1});
    }
  }
  ThreadPool::global().parallel_for(
      plan.num_threads, static_cast<int64_t>(runs.size()), [&](int64_t ri, int thread) {
        const Run& run = runs[ri];
        const WorkItem& w0 = plan.work[run.first_item];
        const int64_t rows = int64_t{w0.qo_end - w0.qo_begin} * heads;
        auto* o = reinterpret_cast<float*>(thread_base +
                                           static_cast<std::size_t>(thread) * layout.thread_bytes);
        float* lse = o + rows * d_ckv;
        for (int64_t r = 0; r < rows; ++r) {
          lse[r] = merge_partial_states(
              run.count, d_ckv,
              [&](int64_t c) {
                const float* st =
                    partial + plan.work[run.first_item + c].partial * layout.state_floats;
                return std::pair{st[rows * d_ckv + r], st + r * d_ckv};
              },
              nullptr, o + r * d_ckv);
        }
        store_rows(pb, args, qo_begin[w0.request] + w0.qo_begin, w0.qo_end - w0.qo_begin, o, lse);
      });
  return Status::Ok();
}

}  // namespace kvattn::cpu
