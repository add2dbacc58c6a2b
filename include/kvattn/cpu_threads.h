// Where the cpu backend's parallel work runs: kvattn's own worker threads, or the OpenMP team of
// the process that calls it.
//
// Inside a framework that runs its own ops on OpenMP (PyTorch, vLLM's CPU worker, oneDNN), that
// runtime's workers keep spinning on the cores for a while after every op. kvattn's own pool,
// started right after, then competes with them for the same cores: on a 2-core machine a decode
// step took several times its time alone. Running kvattn's work items on the host's OpenMP team
// instead uses exactly the threads the framework uses, as the framework's own kernels do.
#pragma once

#include <string>
#include <string_view>

#include "kvattn/status.h"

namespace kvattn {

enum class CpuThreads {
  // kvattn's own pool of worker threads (the default).
  kOwnPool,
  // The OpenMP runtime loaded in this process (GNU libgomp, LLVM libomp or Intel libiomp5, as
  // PyTorch loads it): kvattn calls its GOMP_parallel entry, so its team runs kvattn's work
  // items. A `num_threads` of 0 ("all cores") means the team's default size there
  // (omp_get_max_threads(), e.g. torch.get_num_threads()); a positive one that many threads.
  kHostOpenMp,
  // kHostOpenMp whenever an OpenMP runtime is loaded at the time of a call (looked up again only
  // after the process loads new libraries), else kOwnPool. The Python package's default.
  kAuto,
};

// Process-wide. kHostOpenMp fails with kUnavailable, naming what was looked for, when no OpenMP
// runtime is loaded; the setting is then unchanged.
Status set_cpu_threads(CpuThreads mode);
CpuThreads cpu_threads();

// The modes by name: "own", "openmp", "auto" (the Python package's spelling). An unknown name is
// kInvalidArgument naming the accepted ones.
std::string_view cpu_threads_name(CpuThreads mode);
Status set_cpu_threads(std::string_view mode);

// The file of the OpenMP runtime kHostOpenMp / kAuto would use now; empty when none is loaded.
std::string host_openmp_runtime();

}  // namespace kvattn
