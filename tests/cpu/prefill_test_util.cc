#include "cpu/prefill_test_util.h"

#include <cstddef>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "core/validate.h"
#include "cpu/kernel_table.h"
#include "cpu/prefill/params.h"
#include "cpu/prefill/prefill.h"
#include "kvattn/device.h"

namespace kvattn::cpu::test {

std::vector<KernelLevel> available_levels() {
  std::vector<KernelLevel> levels;
  const detail::CpuFeatures& f = detail::cpu_features();
  for (const CpuKernel& k : cpu_kernels()) {
    if (k.op == KernelOp::kPrefill && kernel_runs_on(k, f.best, f).ok()) {
      levels.insert(levels.begin(), {std::string(k.name)});
    }
  }
  return levels;
}

LevelGuard::LevelGuard(const KernelLevel& level) { set_cpu_kernel_override(level.kernel, true); }
LevelGuard::~LevelGuard() { clear_cpu_kernel_override(); }

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
  const CpuKernel* kernel = nullptr;
  st = choose_cpu_kernel(problem, plan_isa(plan.device), &kernel);
  if (!st.ok()) return st;
  plan.kernel = std::string(kernel->name);
  st = plan_prefill(problem, args, options, &plan);
  if (!st.ok()) return st;
  std::unique_ptr<std::byte[]> workspace(new std::byte[plan.workspace_bytes]);
  return run_prefill(plan, args, workspace.get(), plan.workspace_bytes);
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      {"plain", [](testing::CaseSpec&) {}},
      {"causal", [](testing::CaseSpec& s) { s.problem.mask_mode = MaskMode::kCausal; }},
      {"causal_window",
       [](testing::CaseSpec& s) {
         s.problem.mask_mode = MaskMode::kCausal;
         s.problem.window_left = 9;
       }},
      {"window_only", [](testing::CaseSpec& s) { s.problem.window_left = 20; }},
      {"soft_cap",
       [](testing::CaseSpec& s) {
         // Scores reach a few times the cap, so both branches of the tanh run.
         s.problem.logits_soft_cap = 0.5f;
         s.value_range = 2.0f;
       }},
      {"custom_mask", [](testing::CaseSpec& s) { s.problem.mask_mode = MaskMode::kCustom; }},
      {"custom_mask_packed",
       [](testing::CaseSpec& s) {
         s.problem.mask_mode = MaskMode::kCustom;
         s.packed_custom_mask = true;
       }},
      {"alibi", [](testing::CaseSpec& s) { s.problem.pos_encoding_mode = PosEncoding::kAlibi; }},
      {"rope", [](testing::CaseSpec& s) { s.problem.pos_encoding_mode = PosEncoding::kRopeLlama; }},
      {"rope_interleaved_scaled",
       [](testing::CaseSpec& s) {
         s.problem.pos_encoding_mode = PosEncoding::kRopeLlama;
         s.problem.rope_interleave = true;
         s.problem.rope_theta = 5e5f;
         s.problem.rope_scale = 4.0f;
       }},
      {"lse", [](testing::CaseSpec& s) { s.return_lse = true; }},
      {"fp16_qk_reduction",
       [](testing::CaseSpec& s) {
         s.problem.use_fp16_qk_reduction = true;
         s.return_lse = true;
       }},
      {"sm_scale", [](testing::CaseSpec& s) { s.problem.sm_scale = 0.3f; }},
      {"everything",
       [](testing::CaseSpec& s) {
         s.problem.mask_mode = MaskMode::kCausal;
         s.problem.window_left = 30;
         s.problem.logits_soft_cap = 2.0f;
         s.problem.pos_encoding_mode = PosEncoding::kAlibi;
         s.return_lse = true;
       }},
      {"causal_rope_lse",
       [](testing::CaseSpec& s) {
         s.problem.mask_mode = MaskMode::kCausal;
         s.problem.pos_encoding_mode = PosEncoding::kRopeLlama;
         s.return_lse = true;
       }},
  };
  return all;
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
  expect_matches_reference(c, level, what);
}

void expect_matches_reference(testing::Case& c, const KernelLevel& level,
                              const std::string& what) {
  const testing::CaseSpec& spec = c.spec();
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
