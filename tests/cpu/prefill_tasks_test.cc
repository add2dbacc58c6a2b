// Prefill plans cut by the requests' lengths beyond the tile: tasks of several KV heads for
// tiles of few query rows (prefill_task_heads), and paged batches of one query token a request
// run as the decode they are (plan_prefill).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "cpu/kernel_table.h"
#include "cpu/prefill/prefill.h"
#include "cpu/prefill/tile_config.h"
#include "cpu/prefill_test_util.h"
#include "kvattn/selection.h"

namespace kvattn::cpu::test {
namespace {

// variants() and FP8 caches with per-head and per-(token, head) scales, sinks, and their
// combinations with ALiBi, causal masks and windows.
std::vector<Variant> variants_with_scales_and_sinks() {
  std::vector<Variant> cases = variants();
  cases.push_back({"e4m3_per_head", [](testing::CaseSpec& s) {
                     s.problem.kv_dtype = DType::kE4M3;
                     s.problem.kv_scale_granularity = KVScaleGranularity::kPerHead;
                     s.problem.mask_mode = MaskMode::kCausal;
                   }});
  cases.push_back({"e4m3_per_token", [](testing::CaseSpec& s) {
                     s.problem.kv_dtype = DType::kE4M3;
                     s.problem.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
                     s.problem.o_dtype = DType::kF32;
                     s.problem.mask_mode = MaskMode::kCausal;
                   }});
  cases.push_back({"e5m2_per_token_alibi", [](testing::CaseSpec& s) {
                     s.problem.kv_dtype = DType::kE5M2;
                     s.problem.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
                     s.problem.mask_mode = MaskMode::kCausal;
                     s.problem.pos_encoding_mode = PosEncoding::kAlibi;
                     s.problem.o_dtype = DType::kF32;
                   }});
  cases.push_back({"e5m2_per_head_sinks", [](testing::CaseSpec& s) {
                     s.problem.kv_dtype = DType::kE5M2;
                     s.problem.kv_scale_granularity = KVScaleGranularity::kPerHead;
                     s.problem.use_sinks = true;
                     s.return_lse = true;
                   }});
  cases.push_back({"sinks_window", [](testing::CaseSpec& s) {
                     s.problem.mask_mode = MaskMode::kCausal;
                     s.problem.window_left = 40;
                     s.problem.use_sinks = true;
                     s.return_lse = true;
                   }});
  return cases;
}

// Tasks of several KV heads (prefill_task_heads): over NHD caches, for tiles of at most
// kPrefillHeadTaskRows rows, as many heads as leave kPrefillTasksPerThread tasks a thread and fit
// their scratch slots.
TEST(CpuPrefillHeadTasks, PlanGivesThemToFewRowsOverNhd) {
  Problem p = small_spec(Op::kBatchPrefillPaged, {4}, {4096}).problem;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = p.head_dim_vo = 128;
  auto tile_of_tokens = [&](const Problem& q, int tokens) {
    prefill::PrefillTile t = prefill::prefill_tile(q.group_size(), q.head_dim_qk, q.head_dim_vo);
    t.tokens = tokens;
    t.rows = tokens * q.group_size();
    t.rows_pad = prefill::row_pitch(t.rows);
    return t;
  };
  const prefill::PrefillTile four = tile_of_tokens(p, 4);  // 16 rows
  // 16 requests x 8 heads: 128 items.
  EXPECT_EQ(prefill_task_heads(p, four, 128, 2), 8);
  EXPECT_EQ(prefill_task_heads(p, four, 128, 4), 8);
  EXPECT_EQ(prefill_task_heads(p, four, 128, 8), 4);   // 4 tasks a thread
  EXPECT_EQ(prefill_task_heads(p, four, 128, 32), 1);  // 2 heads leave 2 a thread
  EXPECT_EQ(prefill_task_heads(p, four, 8, 2), 1);
  EXPECT_EQ(prefill_task_heads(p, tile_of_tokens(p, 16), 128, 2), 8);  // 64 rows
  EXPECT_EQ(prefill_task_heads(p, tile_of_tokens(p, 17), 128, 2), 1);  // 68
  Problem hnd = p;
  hnd.kv_layout = KVLayout::kHND;
  EXPECT_EQ(prefill_task_heads(hnd, four, 128, 2), 1);
  Problem two_heads = p;
  two_heads.num_kv_heads = 2;
  two_heads.num_qo_heads = 8;
  EXPECT_EQ(prefill_task_heads(two_heads, four, 128, 2), 2);
  // d 256, 64 rows: a head's slot (Q^T and O^T, 80 rows apart) is 161 KiB, 7 of them past 1 MiB.
  Problem d256 = p;
  d256.head_dim_qk = d256.head_dim_vo = 256;
  EXPECT_EQ(prefill_task_heads(d256, tile_of_tokens(d256, 16), 128, 2), 4);
}

// Requests of a few query tokens over 8 KV heads, at every kernel (1 and 2 threads: 8 and 4 heads
// a task): every variant, per-head and per-token FP8 scales and sinks, against the reference,
// and the same bits as one head a task (16 threads leave too few items for tasks of 2).
TEST(CpuPrefillHeadTasks, MatchReferenceAndOneHeadATask) {
  const std::vector<Variant> cases = variants_with_scales_and_sinks();
  for (const KernelLevel& isa : available_levels()) {
    for (const Variant& v : cases) {
      // Lengths below, at and above the KV tile (64 keys at d 64), a request with one key.
      testing::CaseSpec spec =
          small_spec(Op::kBatchPrefillPaged, {1, 2, 3, 4, 5, 7}, {1, 63, 64, 65, 130, 200});
      spec.problem.num_qo_heads = 16;
      spec.problem.num_kv_heads = 8;
      v.apply(spec);
      expect_matches_reference(spec, isa, "head tasks " + v.name);

      LevelGuard guard(isa);  // (expect_matches_reference's own guard has cleared the override)
      testing::Case c = testing::Case::make(spec);
      AttentionArgs tasks = c.args();
      ASSERT_TRUE(run_cpu_prefill(spec.problem, tasks, 1).ok()) << isa.name() << " " << v.name;
      const std::vector<float> out_tasks = c.out_f32();
      AttentionArgs single = c.args_with_fresh_outputs(spec.problem.o_dtype);
      ASSERT_TRUE(run_cpu_prefill(spec.problem, single, 16).ok()) << isa.name() << " " << v.name;
      const std::vector<float> out_single = c.fresh_out_f32();
      ASSERT_EQ(out_tasks.size(), out_single.size());
      EXPECT_EQ(std::memcmp(out_tasks.data(), out_single.data(), out_tasks.size() * 4), 0)
          << isa.name() << " " << v.name;
    }
  }
}

// The kernel plan_prefill plans for `spec` (the table's choice first, as the backend's plan).
std::string planned_prefill_kernel(const testing::CaseSpec& spec) {
  testing::Case c = testing::Case::make(spec);
  Plan plan;
  plan.device = Device::cpu();
  plan.problem = spec.problem;
  const CpuKernel* k = nullptr;
  EXPECT_TRUE(choose_cpu_kernel(spec.problem, plan_isa(plan.device), &k).ok());
  plan.kernel = std::string(k->name);
  EXPECT_TRUE(plan_prefill(spec.problem, c.args(), PlanOptions{}, &plan).ok());
  return plan.kernel;
}

// A paged batch of one query token a request is planned and run as the decode it is (the decode
// path's kernel and cut), unless KVATTN_CPU_KERNEL names a prefill kernel: every variant, FP8
// scales and sinks against the reference, lengths around the decode tile (32 keys).
TEST(CpuPrefillOneToken, RunsAsTheDecodeItIs) {
  const std::vector<Variant> cases = variants_with_scales_and_sinks();
  auto planned_kernel = [](const testing::CaseSpec& spec) {
    const CpuKernel* planned = find_cpu_kernel(planned_prefill_kernel(spec));
    return planned ? planned->op : KernelOp::kMla;
  };
  for (const Variant& v : cases) {
    testing::CaseSpec spec =
        small_spec(Op::kBatchPrefillPaged, {1, 1, 1, 1, 1}, {1, 31, 32, 33, 200});
    v.apply(spec);
    EXPECT_EQ(planned_kernel(spec), KernelOp::kDecode) << v.name;
    expect_matches_reference(spec, KernelLevel{""}, "one token " + v.name);
  }
  // Not where a request has another length, nor over a ragged cache, nor where a prefill kernel
  // is named.
  EXPECT_EQ(planned_kernel(small_spec(Op::kBatchPrefillPaged, {1, 2}, {40, 40})),
            KernelOp::kPrefill);
  EXPECT_EQ(planned_kernel(small_spec(Op::kBatchPrefillRagged, {1, 1}, {40, 40})),
            KernelOp::kPrefill);
  set_cpu_kernel_override(available_levels().back().kernel);
  EXPECT_EQ(planned_kernel(small_spec(Op::kBatchPrefillPaged, {1, 1}, {40, 40})),
            KernelOp::kPrefill);
  clear_cpu_kernel_override();
}

// explain names that decode kernel ("cpu_kernel_one_token"): the one the plan of a one-token
// batch takes, for every variant; null for a ragged cache, a decode, and a named prefill kernel.
TEST(CpuPrefillOneToken, ExplainNamesItsDecodeKernel) {
  auto one_token = [](const Problem& problem) {
    for (const Verdict& v : explain(problem, Device::cpu()).verdicts) {
      if (v.backend == "cpu") return v.cpu_kernel_one_token;
    }
    return std::string("no cpu verdict");
  };
  for (const Variant& v : variants_with_scales_and_sinks()) {
    testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {1, 1, 1}, {1, 33, 40});
    v.apply(spec);
    const std::string planned = planned_prefill_kernel(spec);
    EXPECT_EQ(one_token(spec.problem), planned) << v.name;
    const std::string json = explain(spec.problem, Device::cpu()).to_json();
    EXPECT_NE(json.find("\"cpu_kernel_one_token\": \"" + planned + "\""), std::string::npos)
        << json;
  }
  const testing::CaseSpec ragged = small_spec(Op::kBatchPrefillRagged, {1, 1}, {40, 40});
  EXPECT_EQ(one_token(ragged.problem), "");
  EXPECT_NE(explain(ragged.problem, Device::cpu()).to_json().find("\"cpu_kernel_one_token\": null"),
            std::string::npos);
  testing::CaseSpec decode = small_spec(Op::kBatchPrefillPaged, {1, 1}, {40, 40});
  decode.problem.op = Op::kBatchDecode;
  decode.problem.mask_mode = MaskMode::kNone;
  EXPECT_EQ(one_token(decode.problem), "");
  set_cpu_kernel_override(available_levels().back().kernel);
  EXPECT_EQ(one_token(small_spec(Op::kBatchPrefillPaged, {1, 1}, {40, 40}).problem), "");
  clear_cpu_kernel_override();
}

}  // namespace
}  // namespace kvattn::cpu::test
