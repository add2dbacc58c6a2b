// fa2's host-side schedule: how a batch is cut into CTAs (work units), where each request's rows,
// keys, mask bits and partial states are, and which rows the split-KV merge combines. One
// function computes it for plan() and run() alike, so the two cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/common/problem_layout.h"
#include "cuda/fa2/params.h"
#include "kvattn/attention.h"
#include "kvattn/problem.h"

namespace kvattn::fa2 {

struct Schedule {
  // The tile: decode (kDecodeRows packed rows, its warps splitting the keys) when every
  // request's rows fit it, else prefill (prefill_rows(head_dim_qk) rows, warps split the rows).
  bool decode_tile = false;
  int64_t tile_rows = kDecodeRows;
  int64_t chunk_size = 0;     // split-KV chunk in keys; 0: no request is split
  std::vector<RequestInfo> requests;
  std::vector<WorkUnit> work;
  std::vector<MergeRow> merge_rows;
  int64_t num_partial_states = 0;
};

// Where each request starts in the (host) index tensors (cuda/common/problem_layout.h).
using cuda::request_starts;
using cuda::RequestStarts;

// The number of SMs assumed when the device is only described (an H100/H200 has 132).
inline constexpr int kAssumedSms = 132;

// requested_chunk > 0 forces that split-KV chunk size, < 0 forbids a split, and 0 lets the
// schedule decide (split only when the batch gives fewer than two CTAs per SM and a request is
// long). run() passes the chunk its plan decided, so plan and run cut the work alike.
Schedule make_schedule(const Problem& problem, const std::vector<int64_t>& qo_len,
                       const std::vector<int64_t>& kv_len, const RequestStarts& starts,
                       bool custom_mask_packed, int64_t requested_chunk, int num_sms);

// fa2's persistent device workspace, made by plan() (one per plan, shared by its copies): the
// schedule's arrays and the page table, copied once from pinned staging, and the split-KV
// partial states. One function computes both the size and the layout (STYLE.md "One source of
// truth"); offsets are in bytes, each 256-byte aligned.
struct WorkspaceLayout {
  std::size_t requests = 0;
  std::size_t work = 0;
  std::size_t merge_rows = 0;
  std::size_t kv_indices = 0;
  // [0, staged_bytes) is what plan() copies from the host; the partial states follow.
  std::size_t staged_bytes = 0;
  std::size_t partial_o = 0;
  std::size_t partial_lse = 0;
  std::size_t total_bytes = 0;
};
WorkspaceLayout workspace_layout(const Schedule& schedule, std::size_t num_kv_indices,
                                 int num_qo_heads, int head_dim_vo);
// Writes the staged part of the workspace ([0, layout.staged_bytes)) into `staging`.
void fill_staging(const Schedule& schedule, const std::vector<int32_t>& kv_indices,
                  const WorkspaceLayout& layout, std::byte* staging);

// The public description of the schedule (Plan::work).
std::vector<WorkItem> describe(const Schedule& schedule, int group);

}  // namespace kvattn::fa2
