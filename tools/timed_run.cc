#include "tools/timed_run.h"

#include <algorithm>
#include <chrono>

#include "core/status_macros.h"

namespace kvattn::tools {

Status timed_run_host(const io::OwnedCase& c, const PlanOptions& options, int repeat,
                      io::OutputBuffers* outputs, TimedRun* out) {
  const Problem& p = c.problem;
  AttentionArgs a = c.args_with_outputs(outputs, p.o_dtype, c.run.return_lse);
  KVATTN_RETURN_IF_ERROR(plan(p, a, options, &out->plan));
  // Warm-up: first touch of the buffers, thread start-up.
  KVATTN_RETURN_IF_ERROR(run(out->plan, a));
  out->seconds.clear();
  for (int i = 0; i < repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    KVATTN_RETURN_IF_ERROR(run(out->plan, a));
    auto stop = std::chrono::steady_clock::now();
    out->seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  std::sort(out->seconds.begin(), out->seconds.end());
  return Status::Ok();
}

}  // namespace kvattn::tools
