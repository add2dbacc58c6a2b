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
#include "core/cpu_features.h"
#include "core/element_io.h"
#include "core/math_constants.h"
#include "core/numeric.h"
#include "core/run_scalars.h"
#include "core/split_kv.h"
#include "core/status_macros.h"
#include "cpu/common/driver.h"
#include "cpu/kernel_table.h"

namespace kvattn::cpu {

bool mla_amx_active() { return detail::cpu_features().amx_bf16; }
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using math::kLog2e;
// Split only into chunks of at least this many keys: a smaller chunk costs more to merge
// (128 rows x D_ckv per state) than it saves.
constexpr int64_t kMinAutoChunk = 512;

using io::load_f32;

// Workspace (common/driver.h): the partial states (each kMlaMaxRows rows of D_ckv outputs and
// their lse), then each thread's item output (rows, then lse) and kernel scratch.
struct MlaWorkspace {
  std::size_t partial_o = 0, partial_lse = 0, threads = 0, item_bytes = 0;
  WorkspaceLayout layout;

  MlaWorkspace(const Problem& p, int64_t partial_states, int num_threads) {
    const std::size_t rows = kMlaMaxRows;
    partial_o = layout.take(sizeof(float) * partial_states * rows * p.head_dim_ckv);
    partial_lse = layout.take(sizeof(float) * partial_states * rows);
    item_bytes = align_up(sizeof(float) * rows * (p.head_dim_ckv + 1), WorkspaceLayout::kAlign);
    threads = layout.take_per_thread(
        item_bytes + mla_kernel_scratch_bytes(p.num_qo_heads, p.head_dim_ckv, p.head_dim_kpe),
        num_threads);
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
  // The caches [P, page_size, D]: page, slot, dim.
  auto strides = [](const TensorView& t) {
    return paged::CacheStrides{t.strides[0], t.strides[1], 0, t.strides[2]};
  };
  p.ckv = static_cast<const std::byte*>(a.ckv_cache.data);
  p.ckv_strides = strides(a.ckv_cache);
  p.kpe = static_cast<const std::byte*>(a.kpe_cache.data);
  p.kpe_strides = strides(a.kpe_cache);
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

}  // namespace

std::size_t mla_kernel_scratch_bytes(int heads, int d_ckv, int d_kpe) {
  (void)heads;
  return MlaScratch<float, float>(nullptr, d_ckv, d_kpe).size;
}

void mla_item_portable(const MlaParams& p, const WorkItem& w, float* o, float* lse,
                       std::byte* scratch) {
  const int heads = p.heads, d_ckv = p.d_ckv, dqk = p.d_ckv + p.d_kpe;
  const int b = w.request;
  const int64_t tokens = w.qo_end - w.qo_begin, rows = tokens * heads;
  const MlaScratch<float, float> area(scratch, d_ckv, p.d_kpe);
  float *q = area.q, *tile = area.tile, *m = area.m, *l = area.l, *s = area.st;  // q [rows][dqk]
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
      for (int d = 0; d < d_ckv; ++d) row[d] = load_f32(c, p.kv_dtype, d * p.ckv_strides.dim);
      for (int d = 0; d < p.d_kpe; ++d)
        row[d_ckv + d] = load_f32(r, p.kv_dtype, d * p.kpe_strides.dim);
    }
    for (int64_t t = 0; t < tokens; ++t) {
      const int visible = p.visible_keys(b, w.qo_begin + t, j0, n);
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
    const math::RowFinish fin = finish_row(m[r], l[r], p.k_scale, false, nullptr);
    for (int d = 0; d < d_ckv; ++d) o[r * d_ckv + d] *= fin.o_scale;
    lse[r] = fin.lse;
  }
}

Status plan_mla(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                Plan* plan) {
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
    chunk = auto_kv_chunk(items, longest, threads, kMlaTileKeys, kMinAutoChunk);
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
  plan->workspace_bytes = MlaWorkspace(problem, partial, threads).layout.bytes();
  return Status::Ok();
}

Status run_mla(const Plan& plan, const AttentionArgs& args, void* workspace,
               std::size_t workspace_bytes) {
  const Problem& pb = plan.problem;
  const MlaWorkspace layout(pb, plan.num_partial_states, plan.num_threads);
  std::byte* ws = nullptr;
  KVATTN_RETURN_IF_ERROR(bind_workspace("mla", layout.layout, workspace, workspace_bytes, &ws));

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
  const OutputRows output = OutputRows::of(args);
  // Row r of an item (or split) starting at query token `token` of the batch: (token + r / heads,
  // head r % heads).
  auto store = [&](int64_t token, int64_t r, const float* o, float lse) {
    output.store(token + r / heads, static_cast<int>(r % heads), o, d_ckv, lse);
  };
  PartialStates partial{reinterpret_cast<float*>(ws + layout.partial_o),
                        reinterpret_cast<float*>(ws + layout.partial_lse), kMlaMaxRows, d_ckv};
  for_each_item(plan.num_threads, static_cast<int64_t>(plan.work.size()), ws + layout.threads,
                layout.layout.thread_stride(), [&](int64_t i, std::byte* mine) {
                  const WorkItem& w = plan.work[i];
                  const int64_t rows = int64_t{w.qo_end - w.qo_begin} * heads;
                  float* o = w.partial >= 0 ? partial.row(w.partial, 0)
                                            : reinterpret_cast<float*>(mine);
                  float* lse = w.partial >= 0 ? &partial.lse_of(w.partial, 0) : o + rows * d_ckv;
                  kernel(params, w, o, lse, mine + layout.item_bytes);
                  if (w.partial >= 0) return;
                  const int64_t token = qo_begin[w.request] + w.qo_begin;
                  for (int64_t r = 0; r < rows; ++r) store(token, r, o + r * d_ckv, lse[r]);
                });
  // Each split (request, token block): its rows merged, then stored.
  merge_splits(
      plan, partial, [&](const WorkItem& w) { return int64_t{w.qo_end - w.qo_begin} * heads; },
      [](const WorkItem&, int64_t) -> const float* { return nullptr; },
      [&](const WorkItem& w, int64_t r, const float* o, float lse) {
        store(qo_begin[w.request] + w.qo_begin, r, o, lse);
      });
  return Status::Ok();
}

}  // namespace kvattn::cpu
