#include "cpu/prefill_test_util.h"

#include <cstddef>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "core/validate.h"
#include "cpu/prefill/params.h"
#include "cpu/prefill/prefill.h"
#include "kvattn/device.h"

namespace kvattn::cpu::test {

std::string KernelLevel::name() const {
  return std::string(cpu_isa_name(isa)) + (bf16_dot ? "+bf16dot" : "");
}

std::vector<KernelLevel> available_levels() {
  std::vector<KernelLevel> levels = {{CpuIsa::kScalar, false}};
  const detail::CpuFeatures& f = detail::cpu_features();
  if (f.best >= CpuIsa::kAvx2) levels.push_back({CpuIsa::kAvx2, false});
  if (f.best >= CpuIsa::kAvx512) levels.push_back({CpuIsa::kAvx512, false});
  if (f.best >= CpuIsa::kAvx512 && f.avx512_bf16) levels.push_back({CpuIsa::kAvx512, true});
  return levels;
}

LevelGuard::LevelGuard(const KernelLevel& level) {
  detail::set_cpu_isa_limit(level.isa);
  prefill::set_bf16_dot_allowed(level.bf16_dot);
}
LevelGuard::~LevelGuard() {
  detail::clear_cpu_isa_limit();
  prefill::clear_bf16_dot_override();
}

Status run_cpu_prefill(const Problem& problem, const AttentionArgs& args, int num_threads) {
  Status st = validate_attention(problem, args);
  if (!st.ok()) return st;
  Plan plan;
  plan.backend = "cpu";
  plan.device = Device::cpu();
  plan.problem = problem;
  PlanOptions options;
  options.backend = "cpu";
  options.num_threads = num_threads;
  st = plan_prefill(problem, args, options, &plan);
  if (!st.ok()) return st;
  std::unique_ptr<std::byte[]> workspace(new std::byte[plan.workspace_bytes]);
  return run_prefill(plan, args, workspace.get(), plan.workspace_bytes);
}

testing::CaseSpec small_spec(Op op, std::vector<int64_t> qo_lens, std::vector<int64_t> kv_lens) {
  testing::CaseSpec spec;
  Problem& p = spec.problem;
  p.op = op;
  p.batch_size = static_cast<int>(kv_lens.size());
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim_qk = 64;
  p.head_dim_vo = 64;
  p.page_size = 16;
  p.q_dtype = DType::kBF16;
  p.kv_dtype = DType::kBF16;
  p.o_dtype = DType::kBF16;
  spec.qo_lens = std::move(qo_lens);
  spec.kv_lens = std::move(kv_lens);
  return spec;
}

void expect_matches_reference(const testing::CaseSpec& spec, const KernelLevel& level,
                              const std::string& what) {
  testing::Case c = testing::Case::make(spec);
  LevelGuard guard(level);
  const testing::CheckResult result = testing::check_against_reference(
      c, [](const Problem& p, const AttentionArgs& a) { return run_cpu_prefill(p, a); });
  // KVATTN_PREFILL_TEST_VERBOSE=1 prints the error figures of passing cases too (the margins).
  if (std::getenv("KVATTN_PREFILL_TEST_VERBOSE") != nullptr) {
    std::cout << what << " [" << level.name() << "] " << result.message << "\n";
  }
  EXPECT_TRUE(result.ok) << what << " [" << level.name() << "] " << spec.problem.to_string() << "\n"
                         << result.message;
}

}  // namespace kvattn::cpu::test
