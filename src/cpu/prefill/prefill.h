// The CPU prefill path (single_prefill, batch_prefill_paged, batch_prefill_ragged): the contract
// between the cpu backend (src/cpu/backend.cc) and the prefill kernels in this directory.
#pragma once

#include <cstddef>

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::cpu {

// Cuts prefill work (fills plan->work, workspace_bytes, num_threads) with the tile of the kernel
// plan->kernel names (the kernel table's choice, made first); args validated.
Status plan_prefill(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                    Plan* plan);
// Runs a prefill plan made by plan_prefill.
Status run_prefill(const Plan& plan, const AttentionArgs& args, void* workspace,
                   std::size_t workspace_bytes);

}  // namespace kvattn::cpu
