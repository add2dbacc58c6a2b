// The standard benchmark cases (issue 4), shared by `kvattn bench` and the Google Benchmark
// executable so that both measure the same thing.
#pragma once

#include <string>
#include <vector>

#include "testing/case_builder.h"

namespace kvattn::bench {

struct BenchCase {
  std::string name;
  testing::CaseSpec spec;
  // Decode is judged by bytes moved against DRAM bandwidth, prefill by FLOPs against FMA peak.
  bool memory_bound = true;
  // Compute-bound on bf16 dot products (vdpbf16ps) where the CPU has them: judged against that
  // peak instead of the f32 FMA one.
  bool bf16_dot = false;
};

std::vector<BenchCase> standard_cases();

}  // namespace kvattn::bench
