// The shared pieces of the bad-input catalogue (bad_input_catalogue_test.cc): the case type, the
// op sets and the helpers that break one thing of a valid AttentionFixture. Issue 11's cases
// (sinks, per-head / per-(token, head) scales) live in bad_input_variants.cc.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "hardening/fixtures.h"
#include "kvattn/attention.h"

namespace kvattn::hardening {

inline constexpr unsigned bit(Op op) { return 1u << static_cast<unsigned>(op); }
inline constexpr unsigned kSingle = bit(Op::kSingleDecode) | bit(Op::kSinglePrefill);
inline constexpr unsigned kPaged = bit(Op::kBatchDecode) | bit(Op::kBatchPrefillPaged);
inline constexpr unsigned kRaggedKv = bit(Op::kBatchPrefillRagged);
inline constexpr unsigned kRaggedQ = bit(Op::kBatchPrefillPaged) | bit(Op::kBatchPrefillRagged);
inline constexpr unsigned kBatch = kPaged | kRaggedKv;
inline constexpr unsigned kWithKv = kSingle | kRaggedKv;  // ops that read k and v
inline constexpr unsigned kAll = kSingle | kBatch;
inline constexpr Op kOps[] = {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode,
                              Op::kBatchPrefillPaged, Op::kBatchPrefillRagged};

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// The tensor that holds the keys of an op: k, or the paged K cache.
inline TensorView& keys(AttentionFixture& f) {
  return is_paged(f.problem.op) ? f.args.paged_k_cache : f.args.k;
}
inline TensorView& values(AttentionFixture& f) {
  return is_paged(f.problem.op) ? f.args.paged_v_cache : f.args.v;
}
// Adds a trailing dim of 1: same elements, wrong rank.
inline void add_unit_dim(TensorView* t) {
  t->shape[t->rank] = 1;
  t->strides[t->rank] = 1;
  ++t->rank;
}

struct AttentionCase {
  std::string name;
  unsigned ops;
  std::function<void(AttentionFixture&)> mutate;
  ErrorCode code;
  // Only the tensors change, so a plan made for the valid call must refuse them in run() too.
  bool args_only = true;
  MaskMode mask = MaskMode::kNone;
  bool packed_mask = false;
  // A data tensor that planning a batch operation does not need (plan reads the index tensors
  // only, as FlashInfer's plan does): plan accepts its absence, run refuses it.
  bool plan_needs_no_data = false;
};

using F = AttentionFixture;

// Sinks and FP8 scale granularity (issue 11).
std::vector<AttentionCase> variant_cases();

}  // namespace kvattn::hardening
