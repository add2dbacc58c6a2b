// fa3's kernel body on the SM90 CTA emulator (fa3_replay.cc): the instantiation for a kernel key,
// and a testing::RunBackend that plans with fa3's plan(), makes the parameters with run()'s host
// function (kernel_params.h) and replays the body (then the split-KV merge) on the CPU.
#pragma once

#include <cstdint>

#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/params.h"
#include "testing/tolerance.h"

namespace kvattn::fa3 {

struct ReplayOptions {
  int64_t kv_chunk_size = 0;  // PlanOptions::kv_chunk_size: 0 the planner's choice
  int ctas = 2;               // persistent CTAs (each walks every ctas-th tile)
  bool tma_lands_early = false;
};

// Runs the body of `key` on min(ctas, tiles) emulated CTAs; false when the key has no kernel.
// Throws emu::EmulatorError for a broken rule.
bool replay_kernel(const KernelKey& key, const PrefillParams& k, int ctas, bool tma_lands_early);

testing::RunBackend run_replay(const ReplayOptions& o);

}  // namespace kvattn::fa3
