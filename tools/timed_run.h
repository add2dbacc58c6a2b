// One attention call, planned once, run after a warm-up `repeat` times and timed: on the host, or
// on a CUDA device with the case's data tensors copied to device memory (index tensors stay on
// the host, as the CUDA backends take them).
#pragma once

#include <vector>

#include "kvattn/attention.h"
#include "kvattn/status.h"
#include "tools/case_file.h"

namespace kvattn::tools {

struct TimedRun {
  Plan plan;
  std::vector<double> seconds;  // per timed run, sorted
  double median() const { return seconds.empty() ? 0.0 : seconds[seconds.size() / 2]; }
};

// Outputs land in `outputs` (host memory, the problem's o dtype, lse when it returns it).
Status timed_run_host(const io::OwnedCase& c, const PlanOptions& options, int repeat,
                      io::OutputBuffers* outputs, TimedRun* out);
// kUnavailable when this build has no CUDA support.
Status timed_run_cuda(const io::OwnedCase& c, const PlanOptions& options, int repeat,
                      io::OutputBuffers* outputs, TimedRun* out);

}  // namespace kvattn::tools
