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
};

std::vector<BenchCase> standard_cases();

}  // namespace kvattn::bench
