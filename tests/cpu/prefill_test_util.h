// Shared helpers of the CPU prefill tests: running the prefill path directly (plan_prefill +
// run_prefill, as the cpu backend does) at a chosen ISA level, and checking it against the
// reference with the tolerance of testing/tolerance.h.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kvattn/attention.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::cpu::test {

// A prefill kernel of the table (kernel_table.h).
struct KernelLevel {
  std::string kernel;
  std::string name() const { return kernel; }
};

// Every prefill kernel this machine can run, the portable one first.
std::vector<KernelLevel> available_levels();

// Names the level's kernel for the lifetime of the object (a problem it does not compute takes
// the default choice).
class LevelGuard {
 public:
  explicit LevelGuard(const KernelLevel& level);
  ~LevelGuard();
  LevelGuard(const LevelGuard&) = delete;
  LevelGuard& operator=(const LevelGuard&) = delete;
};

// A prefill variant (mask, window, soft cap, positional encoding, LSE, ...) applied to a spec.
struct Variant {
  std::string name;
  void (*apply)(testing::CaseSpec& spec);
};
// Every variant the prefill tests walk (prefill_test.cc, prefill_tasks_test.cc).
const std::vector<Variant>& variants();

// Validates, plans with plan_prefill and runs with run_prefill on `num_threads` threads.
Status run_cpu_prefill(const Problem& problem, const AttentionArgs& args, int num_threads = 0);

// A spec with small, fast defaults: batch_prefill_paged, 4 q heads over 2 KV heads, d 64,
// bf16 q/kv/o, page size 16.
testing::CaseSpec small_spec(Op op, std::vector<int64_t> qo_lens, std::vector<int64_t> kv_lens);

// Builds the case, runs the CPU prefill at `level` and compares with the reference; a failure
// names the level, the problem and the error figures.
void expect_matches_reference(const testing::CaseSpec& spec, const KernelLevel& level,
                              const std::string& what = "");
// The same for a case whose inputs the test has set itself.
void expect_matches_reference(testing::Case& c, const KernelLevel& level, const std::string& what);

}  // namespace kvattn::cpu::test
