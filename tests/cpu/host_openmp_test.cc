// The cpu backend on the host process's OpenMP team (kvattn/cpu_threads.h). This executable links
// an OpenMP runtime (GCC's libgomp), as a PyTorch process has one loaded: kHostOpenMp must run
// every work item exactly once on that team, and attention there must match the reference.
#include <omp.h>

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <vector>

#include "cpu/common/thread_pool.h"
#include "cpu_test_util.h"
#include "kvattn/cpu_threads.h"

namespace kvattn {
namespace {

using cpu::ThreadPool;

// Restores the process-wide mode after each test.
class HostOpenMp : public ::testing::Test {
 protected:
  void TearDown() override { ASSERT_TRUE(set_cpu_threads(CpuThreads::kOwnPool).ok()); }
};

TEST_F(HostOpenMp, FindsTheLinkedRuntime) {
  EXPECT_EQ(cpu_threads(), CpuThreads::kOwnPool);  // the C++ default
  // This binary calls omp_get_max_threads, so libgomp is loaded and in the global scope.
  ASSERT_GE(omp_get_max_threads(), 1);
  EXPECT_NE(host_openmp_runtime().find("gomp"), std::string::npos) << host_openmp_runtime();
}

void expect_items_on_team(int threads) {
  constexpr int64_t kItems = 1000;
  std::vector<std::atomic<int>> runs(kItems);
  std::atomic<int> outside_team{0}, wrong_id{0};
  std::mutex mutex;
  std::set<int> ids;
  ThreadPool::global().parallel_for(threads, kItems, [&](int64_t item, int thread_id) {
    runs[item].fetch_add(1);
    if (!omp_in_parallel()) outside_team.fetch_add(1);
    if (thread_id != omp_get_thread_num() || thread_id < 0 || thread_id >= threads) {
      wrong_id.fetch_add(1);
    }
    std::lock_guard<std::mutex> lock(mutex);
    ids.insert(thread_id);
  });
  for (int64_t i = 0; i < kItems; ++i) ASSERT_EQ(runs[i].load(), 1) << "item " << i;
  EXPECT_EQ(outside_team.load(), 0) << "items ran outside an OpenMP parallel region";
  EXPECT_EQ(wrong_id.load(), 0) << "thread ids must be the team's, in [0, " << threads << ")";
  EXPECT_FALSE(ids.empty());
}

TEST_F(HostOpenMp, RunsEveryItemOnceOnTheTeam) {
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kHostOpenMp).ok());
  EXPECT_EQ(cpu_threads(), CpuThreads::kHostOpenMp);
  for (int threads : {2, 3, 8}) expect_items_on_team(threads);
}

// parallel_for_ahead on the team: every item once, each claimed next run by the same team thread.
TEST_F(HostOpenMp, ClaimsAheadOnTheTeam) {
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kHostOpenMp).ok());
  constexpr int kThreads = 3;
  constexpr int64_t kItems = 500;
  std::vector<std::atomic<int>> runs(kItems);
  std::vector<int> thread_of(kItems, -1);
  std::vector<int64_t> next_of(kItems, -1);
  std::atomic<int> off_team{0};
  ThreadPool::global().parallel_for_ahead(
      kThreads, kItems, [](int64_t item) { return item % 2 == 0; },
      [&](int64_t item, int64_t next, bool, int thread_id) {
        runs[item].fetch_add(1);
        if (!omp_in_parallel() || thread_id != omp_get_thread_num()) off_team.fetch_add(1);
        thread_of[item] = thread_id;
        next_of[item] = next;
      });
  EXPECT_EQ(off_team.load(), 0);
  for (int64_t i = 0; i < kItems; ++i) {
    ASSERT_EQ(runs[i].load(), 1) << "item " << i;
    if (next_of[i] >= 0) EXPECT_EQ(thread_of[next_of[i]], thread_of[i]) << "item " << i;
  }
}

TEST_F(HostOpenMp, AutoTakesTheLoadedRuntime) {
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kAuto).ok());
  expect_items_on_team(4);
}

TEST_F(HostOpenMp, NestedCallsRunInline) {
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kHostOpenMp).ok());
  std::atomic<int> inner{0}, inner_not_inline{0};
  ThreadPool::global().parallel_for(2, 4, [&](int64_t, int) {
    ThreadPool::global().parallel_for(2, 10, [&](int64_t, int thread_id) {
      inner.fetch_add(1);
      if (thread_id != 0) inner_not_inline.fetch_add(1);
    });
  });
  EXPECT_EQ(inner.load(), 40);
  EXPECT_EQ(inner_not_inline.load(), 0);
}

// Called from inside the host's own parallel region, kvattn's job still runs every item once.
TEST_F(HostOpenMp, CalledFromInsideAHostParallelRegion) {
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kHostOpenMp).ok());
  std::atomic<int> items{0};
#pragma omp parallel num_threads(2)
  {
    ThreadPool::global().parallel_for(2, 100, [&](int64_t, int) { items.fetch_add(1); });
  }
  EXPECT_EQ(items.load(), 2 * 100);
}

// Batch decode and a causal prefill on the team, split-KV merge included, against the reference.
TEST_F(HostOpenMp, AttentionMatchesTheReference) {
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kHostOpenMp).ok());
  testing::CaseSpec decode;
  Problem& d = decode.problem;
  d.op = Op::kBatchDecode;
  d.batch_size = 5;
  d.num_qo_heads = 8;
  d.num_kv_heads = 2;
  d.head_dim_qk = d.head_dim_vo = 128;
  d.page_size = 16;
  d.q_dtype = d.kv_dtype = d.o_dtype = DType::kBF16;
  decode.kv_lens = {1, 17, 300, 64, 1000};
  const CpuIsa best = cputest::isa_levels().back();
  cputest::expect_matches_reference(decode, best, {.num_threads = 2});
  cputest::expect_matches_reference(decode, best, {.num_threads = 2, .kv_chunk_size = 64});

  testing::CaseSpec prefill = decode;
  Problem& p = prefill.problem;
  p.op = Op::kBatchPrefillPaged;
  p.mask_mode = MaskMode::kCausal;
  prefill.qo_lens = {1, 17, 130, 64, 200};
  cputest::expect_matches_reference(prefill, best, {.num_threads = 2});
}

}  // namespace
}  // namespace kvattn
