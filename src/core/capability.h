// A backend's capability, declared once as data. can_implement reads it; the CUDA kernel tables
// are instantiated from the same arrays, so what a backend says it supports and what it has
// kernels for cannot drift (DESIGN.md §3).
#pragma once

#include <span>

#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn {

struct HeadDimPair {
  int qk;
  int vo;
  constexpr bool operator==(const HeadDimPair&) const = default;
};

// A constraint that is not a plain membership test, e.g. "FP8 KV needs an FP8 query".
// Returns OK or kNotSupported with the reason.
using CapabilityRule = Status (*)(const Problem&, const Device&);

struct CapabilityDecl {
  const char* backend;
  Device::Kind device_kind;
  int min_sm = 0;  // CUDA: inclusive; 0 = no bound
  int max_sm = 0;  // CUDA: inclusive; 0 = no bound
  std::span<const Op> ops;
  std::span<const DType> q_dtypes;
  std::span<const DType> kv_dtypes;
  std::span<const DType> o_dtypes;
  std::span<const HeadDimPair> head_dims;  // empty: any positive pair
  std::span<const MaskMode> mask_modes;
  std::span<const PosEncoding> pos_encodings;
  std::span<const KVLayout> kv_layouts;
  bool soft_cap = true;
  bool sliding_window = true;
  bool fp16_qk_reduction = true;
  bool sinks = false;  // attention sinks (Problem::use_sinks)
  // FP8 K/V scale granularities; empty: per_tensor only.
  std::span<const KVScaleGranularity> kv_scale_granularities;
  std::span<const CapabilityRule> rules;
  // Set where the backend declares MLA (batch_mla_paged) unsupported: why, for explain.
  const char* mla_unsupported_reason = nullptr;
};

// OK, or kNotSupported naming the backend, the constraint and the offending value.
Status check_capability(const CapabilityDecl& decl, const Problem& problem, const Device& device);

}  // namespace kvattn
