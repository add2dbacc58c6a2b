// fa3's CUDA entry points, called by backend.cc when fa3's kernels are built. Plain host
// declarations (no CUDA types), defined in launch.cu. Memory: as fa2's (fa2/launch.h): data tensors
// in device memory, index tensors in host memory, work on the legacy default stream.
#pragma once

#include "kvattn/attention.h"
#include "kvattn/status.h"

namespace kvattn::fa3 {

// Prefill (single, paged, ragged) and decode (single, batch; GQA rows packed), with the split-KV
// chunk of the plan and the merge.
Status run_attention(const Plan& plan, const AttentionArgs& args);

// SMs of CUDA device `index`; 0 when it cannot be read.
int device_sm_count(int index);

}  // namespace kvattn::fa3
