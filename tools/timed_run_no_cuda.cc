// timed_run_cuda in a build without CUDA support.
#include "core/status_macros.h"
#include "tools/timed_run.h"

namespace kvattn::tools {

Status timed_run_cuda(const io::OwnedCase&, const PlanOptions& options, int, io::OutputBuffers*,
                      TimedRun*) {
  return make_error(ErrorCode::kUnavailable, "device ", options.device.to_string(),
                    ": this build of kvattn has no CUDA support");
}

}  // namespace kvattn::tools
