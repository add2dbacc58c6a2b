// fa3's kernel parameters (params.h PrefillParams) from a plan and its tensors, on the host: how
// the kernel copies each tensor's rows (16-byte chunks, or gathered where the dim is strided or
// the rows misaligned: any strides run), the
// parameters with TMA maps for dense and ragged 16-bit K/V, the split-KV plan of the plan's chunk
// (split_plan.h) and the longest-first tile list (decode: GQA rows packed). The device pointers
// (requests, tiles, kv_indices, partial states) are left for the caller, who points them at its
// copies of the host vectors made here. One function for run() (launch.cu: the driver's
// cuTensorMapEncodeTiled, device copies) and the CPU replay of the kernel body
// (tests/cuda/fa3/fa3_replay_test.cc: the emulator's tensor maps, host memory), so the two cannot
// drift.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "cuda/common/split_merge.h"
#include "cuda/fa3/params.h"
#include "cuda/fa3/split_plan.h"
#include "kvattn/attention.h"
#include "kvattn/status.h"

namespace kvattn::fa3 {

// cuTensorMapEncodeTiled's arguments for a K or V map over [pages, slots, H_kv, D] (4-d,
// innermost first: D, H_kv, slots, pages; dense and ragged K/V: one page of all tokens), 16-bit
// or FP8 elements (FP8 as bytes), no interleave, element strides 1, the 128-byte swizzle,
// out-of-range elements read as zero.
struct KvMapSpec {
  DType dtype = DType::kBF16;
  const void* data = nullptr;
  uint64_t dims[4] = {};
  uint64_t strides[3] = {};  // bytes, of dims 1, 2 and 3
  uint32_t box[4] = {};
};
// Encodes `spec` into `map`; false when it cannot (the producer then copies with cp.async).
using EncodeKvMap = std::function<bool(CUtensorMap* map, const KvMapSpec& spec)>;

struct KernelInputs {
  PrefillParams params;  // requests, tiles, kv_indices, partial_o / partial_lse unset
  std::vector<RequestInfo> requests;
  std::vector<sched::Tile> tiles;   // empty: nothing to run
  std::vector<int32_t> kv_indices;  // paged: the page table
  split_kv::SplitPlan split;
};

Status make_kernel_inputs(const Plan& plan, const AttentionArgs& args, const EncodeKvMap& encode,
                          KernelInputs* out);

// The split-KV merge's parameters (cuda/common/split_merge.h, one kernel for fa2 and fa3) from
// the kernel's, once its partial states are set; `rows` holds split.merge_rows where the merge
// reads them (the device copy in run(), the host vector in the replay). fa3 has no sinks.
inline cuda::MergeParams merge_params(const PrefillParams& k, const split_kv::MergeRow* rows,
                                      const split_kv::SplitPlan& split, const Problem& p) {
  return cuda::merge_params(k, rows, int64_t(split.merge_rows.size()), p.num_qo_heads,
                            p.head_dim_vo, nullptr, 0);
}

}  // namespace kvattn::fa3
