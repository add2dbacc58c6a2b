// The helpers of fa3's replay tests (fa3_replay_test.cc, fa3_replay_counters_test.cc,
// fa3_pingpong_test.cc): the grid's keys (KVATTN_FA3_REPLAY_FULL=1: every declared key), the GPU
// test's case, and a replay checked against the fp64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "core/capability.h"
#include "cuda/common/case_spec.h"
#include "cuda/fa3/capability.h"
#include "cuda/fa3/fa3_replay.h"
#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/kernel_keys.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::fa3 {

inline bool full_grid() {
  const char* v = std::getenv("KVATTN_FA3_REPLAY_FULL");
  return v != nullptr && std::string(v) == "1";
}

// The GPU test's case (common/case_spec.h), with 4 query heads by default.
inline testing::CaseSpec spec_for(const KernelKey& key, Op op, std::vector<int64_t> qo,
                                  std::vector<int64_t> kv, int qo_heads = 4, int kv_heads = 2) {
  return cuda::kernel_case_spec(key, op, std::move(qo), std::move(kv), qo_heads, kv_heads);
}

inline testing::CheckResult replay(testing::Case& c, const ReplayOptions& o = {}) {
  return testing::check_against_reference(c, run_replay(o));
}

inline void expect_matches(const testing::CaseSpec& spec, const std::string& what,
                           const ReplayOptions& o = {}) {
  testing::Case c = testing::Case::make(spec);
  const testing::CheckResult r = replay(c, o);
  EXPECT_TRUE(r.ok) << what << " [" << spec.problem.to_string() << "]: " << r.message;
}

inline const Device kSm90 = Device::parse("cuda:sm90").value();
inline bool declared(const Problem& p) { return check_capability(capability(), p, kSm90).ok(); }

inline const KernelKey kBf16D128{DType::kBF16, DType::kBF16, 128, 128};
inline const KernelKey kE4m3D128{DType::kE4M3, DType::kE4M3, 128, 128};
inline const KernelKey kCiKeys[] = {kBf16D128, kE4m3D128};

inline std::vector<KernelKey> all_keys() {
  return std::vector<KernelKey>(std::begin(kImplementedKernelKeys),
                                std::end(kImplementedKernelKeys));
}
inline std::vector<KernelKey> grid_keys() {
  return full_grid() ? all_keys() : std::vector<KernelKey>(std::begin(kCiKeys), std::end(kCiKeys));
}

}  // namespace kvattn::fa3
