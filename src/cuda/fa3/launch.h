// fa3's CUDA entry point, called by backend.cc when fa3's kernels are built. A plain host
// declaration (no CUDA types), defined in launch.cu. Memory: as fa2's (fa2/launch.h): data tensors
// in device memory, index tensors in host memory, work on the legacy default stream.
#pragma once

#include "kvattn/attention.h"
#include "kvattn/status.h"

namespace kvattn::fa3 {

Status run_prefill(const Plan& plan, const AttentionArgs& args);

}  // namespace kvattn::fa3
