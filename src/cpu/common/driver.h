// The cpu backend's one driver, for decode, prefill and MLA: the workspace (workspace.h's layout,
// bound to the caller's buffer here), each thread's scratch, the pool's parallel-for over the
// plan's work items, and the split-KV merge of partial states through core/attention_math.h's
// StateMerger (fa2's and fa3's merge fold the same way). Each op keeps only its params builder
// and its mainloop kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/attention_math.h"
#include "cpu/common/epilogue.h"
#include "cpu/common/thread_pool.h"
#include "cpu/common/workspace.h"
#include "kvattn/attention.h"
#include "kvattn/status.h"

namespace kvattn::cpu {

// The run's workspace aligned for `layout`; a clear error naming `op` when it is smaller than the
// plan's (or null while the plan needs one).
Status bind_workspace(const char* op, const WorkspaceLayout& layout, void* workspace,
                      std::size_t workspace_bytes, std::byte** base);

// The automatic split-KV chunk: 0 (no split) where `items` unsplit items keep `threads` threads
// busy (4 items each, so that dynamic scheduling evens out their lengths); else the longest key
// range cut into enough pieces, in whole tiles of `tile` keys, at least `min_chunk` keys each.
int64_t auto_kv_chunk(int64_t items, int64_t longest, int threads, int tile, int64_t min_chunk);

// fn(item, scratch) for items [0, count) on the pool, scratch the calling thread's region of
// `thread_stride` bytes from `scratch`.
template <class Fn>
void for_each_item(int threads, int64_t count, std::byte* scratch, std::size_t thread_stride,
                   Fn&& fn) {
  ThreadPool::global().parallel_for(threads, count, [&](int64_t i, int thread) {
    fn(i, scratch + thread_stride * static_cast<std::size_t>(thread));
  });
}

// for_each_item for items that claim their successor before they run where ahead(i) holds
// (ThreadPool::parallel_for_ahead): fn(i, next, claimed, scratch), `next` the item the thread
// runs after i (-1: not claimed yet) and `claimed` whether i was its thread's previous `next`.
template <class Ahead, class Fn>
void for_each_item_ahead(int threads, int64_t count, std::byte* scratch, std::size_t thread_stride,
                         Ahead&& ahead, Fn&& fn) {
  ThreadPool::global().parallel_for_ahead(
      threads, count, ahead, [&](int64_t i, int64_t next, bool claimed, int thread) {
        fn(i, next, claimed, scratch + thread_stride * static_cast<std::size_t>(thread));
      });
}

// A task of consecutive work items on consecutive KV heads: work[first, first + heads), whose
// token rows of all those heads a kernel reads as one run (decode's tasks, prefill's head tasks).
struct HeadRun {
  int64_t first = 0;
  int heads = 1;
};
// The plan's items cut into runs of up to `max_heads` items of one request, query range and KV
// range on consecutive KV heads, in the plan's order.
std::vector<HeadRun> head_runs(const std::vector<WorkItem>& work, int max_heads);

// One split: the plan's items (indices, in chunk order) of one (request, KV head, query range)
// that wrote partial states.
using Split = std::vector<int64_t>;
std::vector<Split> find_splits(const std::vector<WorkItem>& work);

// The partial states `count` in chunk order, state(k) giving {lse, o}, folded into o [dim]
// (normalized); returns the merged natural-log LSE. The sink, when given, joins once here as one
// more state with no value (the partials exclude it). A NaN LSE or a NaN in a weighted o_k makes
// the row NaN; a row that no partial gave a key yields o = 0 and lse = -inf (or the sink's logit).
template <class State>
float fold_states(int64_t count, int dim, State state, const float* sink, float* o) {
  math::StateMerger merger;
  std::fill(o, o + dim, 0.0f);
  auto rescale = [&](float factor) {
    if (factor == 1.0f) return;
    for (int d = 0; d < dim; ++d) o[d] *= factor;
  };
  for (int64_t k = 0; k < count; ++k) {
    const auto [lse, o_k] = state(k);
    float scale_acc = 1.0f, scale_k = 0.0f;
    merger.add(lse, &scale_acc, &scale_k);
    rescale(scale_acc);
    if (scale_k == 0.0f) continue;  // an empty partial (lse = -inf) adds nothing, even a NaN o
    for (int d = 0; d < dim; ++d) o[d] += scale_k * o_k[d];
  }
  if (sink != nullptr) {
    float scale_acc = 1.0f, scale_sink = 0.0f;
    merger.add(*sink, &scale_acc, &scale_sink);
    rescale(scale_acc);
  }
  rescale(merger.inv_sum());
  return merger.lse();
}

// Merges every split of the plan on the pool: for each, rows r in [0, rows(first item)) of the
// states (first item's .partial, ...) into one row each, then store(first item, r, o, lse).
// sink(first item, r): the row's sink logit or null.
template <class Rows, class Sink, class Store>
void merge_splits(const Plan& plan, const PartialStates& states, Rows rows, Sink sink,
                  Store store) {
  if (plan.num_partial_states == 0) return;
  const std::vector<Split> splits = find_splits(plan.work);
  std::vector<std::vector<float>> merged(std::max(plan.num_threads, 1));
  ThreadPool::global().parallel_for(
      plan.num_threads, static_cast<int64_t>(splits.size()), [&](int64_t s, int thread) {
        const Split& split = splits[s];
        const WorkItem& w0 = plan.work[split.front()];
        std::vector<float>& o = merged[thread];
        o.resize(states.dim);
        const int64_t count = static_cast<int64_t>(split.size());
        for (int64_t r = 0, n = rows(w0); r < n; ++r) {
          const float lse = fold_states(
              count, states.dim,
              [&](int64_t k) {
                const int64_t state = plan.work[split[k]].partial;
                return std::pair{states.lse_of(state, r), states.row(state, r)};
              },
              sink(w0, r), o.data());
          store(w0, r, o.data(), lse);
        }
      });
}

}  // namespace kvattn::cpu
