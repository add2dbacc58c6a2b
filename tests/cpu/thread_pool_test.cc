#include "cpu/common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/cpu_threads.h"

namespace kvattn::cpu {
namespace {

TEST(CpuThreadPool, RunsEveryItemExactlyOnce) {
  for (int threads : {0, 1, 2, 3, 8}) {
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> max_thread{0};
      ThreadPool::global().parallel_for(threads, n, [&](int64_t item, int thread_id) {
        hits[item].fetch_add(1);
        int seen = max_thread.load();
        while (thread_id > seen && !max_thread.compare_exchange_weak(seen, thread_id)) {
        }
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "item " << i;
      EXPECT_LT(max_thread.load(), resolve_num_threads(threads));
    }
  }
}

TEST(CpuThreadPool, NestedCallsRunInline) {
  std::atomic<int64_t> sum{0};
  ThreadPool::global().parallel_for(2, 4, [&](int64_t outer, int) {
    ThreadPool::global().parallel_for(2, 10, [&](int64_t inner, int thread_id) {
      EXPECT_EQ(thread_id, 0);
      sum.fetch_add(outer * 10 + inner);
    });
  });
  EXPECT_EQ(sum.load(), 780);  // sum of 0..39
}

TEST(CpuThreadPool, ResolvesThreadCounts) {
  EXPECT_GE(resolve_num_threads(0), 1);
  EXPECT_EQ(resolve_num_threads(3), 3);
}

// This executable links no OpenMP runtime: asking for the host's team is an error naming what was
// looked for, and kAuto keeps kvattn's own pool.
TEST(CpuThreadPool, HostOpenMpUnavailableWithoutARuntime) {
  ASSERT_EQ(host_openmp_runtime(), "");
  const Status s = set_cpu_threads(CpuThreads::kHostOpenMp);
  EXPECT_EQ(s.code(), ErrorCode::kUnavailable);
  EXPECT_NE(s.message().find("GOMP_parallel"), std::string::npos) << s.message();
  EXPECT_EQ(cpu_threads(), CpuThreads::kOwnPool);
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kAuto).ok());
  std::vector<std::atomic<int>> runs(100);
  ThreadPool::global().parallel_for(2, 100, [&](int64_t item, int thread_id) {
    EXPECT_TRUE(thread_id == 0 || thread_id == 1);
    runs[item].fetch_add(1);
  });
  for (const auto& r : runs) EXPECT_EQ(r.load(), 1);
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kOwnPool).ok());
}

TEST(CpuThreadPool, ThreadModesByName) {
  for (CpuThreads mode : {CpuThreads::kOwnPool, CpuThreads::kAuto}) {
    ASSERT_TRUE(set_cpu_threads(cpu_threads_name(mode)).ok());
    EXPECT_EQ(cpu_threads(), mode);
  }
  EXPECT_EQ(cpu_threads_name(CpuThreads::kHostOpenMp), "openmp");
  const Status s = set_cpu_threads(std::string_view("omp"));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cpu_threads: 'omp'"), std::string::npos) << s.message();
  EXPECT_EQ(cpu_threads(), CpuThreads::kAuto);  // unchanged
  ASSERT_TRUE(set_cpu_threads(CpuThreads::kOwnPool).ok());
}

}  // namespace
}  // namespace kvattn::cpu
