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

// parallel_for_ahead: every item once; an item that asks (ahead) runs with the item its thread
// runs next already claimed, one that does not with none; `claimed` marks exactly the items so
// claimed; each thread runs its items in the order it took them (inline: 0, 1, ...).
TEST(CpuThreadPool, ClaimsTheNextItemAheadWhereAsked) {
  for (int threads : {0, 1, 2, 3, 8}) {
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      const int team = resolve_num_threads(threads);
      auto ahead = [](int64_t item) { return item % 3 != 0; };
      std::vector<std::atomic<int>> hits(n);
      std::vector<int64_t> next_of(n, -2);
      std::vector<char> claimed_of(n, 0);
      std::vector<std::vector<int64_t>> order(team);  // each thread's items, in its order
      ThreadPool::global().parallel_for_ahead(
          threads, n, ahead, [&](int64_t item, int64_t next, bool claimed, int thread_id) {
            ASSERT_GE(thread_id, 0);
            ASSERT_LT(thread_id, team);
            hits[item].fetch_add(1);
            next_of[item] = next;
            claimed_of[item] = claimed;
            order[thread_id].push_back(item);
          });
      std::vector<char> is_next(n, 0);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "item " << i;
        if (!ahead(i)) EXPECT_EQ(next_of[i], -1) << "item " << i << " did not ask";
        if (next_of[i] >= 0) {
          ASSERT_LT(next_of[i], n);
          is_next[next_of[i]] = 1;
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(claimed_of[i] != 0, is_next[i] != 0) << "threads " << threads << ", item " << i;
      }
      for (const std::vector<int64_t>& items : order) {
        for (std::size_t k = 0; k < items.size(); ++k) {
          const int64_t next = next_of[items[k]];
          if (next >= 0) {
            ASSERT_LT(k + 1, items.size()) << "item " << items[k] << "'s next did not run after it";
            EXPECT_EQ(items[k + 1], next) << "item " << items[k];
          } else if (ahead(items[k])) {
            // Claimed nothing although it asked: every item was taken by then.
            EXPECT_EQ(k + 1, items.size()) << "item " << items[k];
          }
        }
      }
      if (resolve_num_threads(threads) == 1 || n <= 1) {
        // One thread: in order, each asking item's next the one after it.
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_EQ(next_of[i], ahead(i) && i + 1 < n ? i + 1 : -1) << "item " << i;
        }
      }
    }
  }
}

// Jobs back to back, as a serving engine's calls of one layer come: the workers take each while
// they still spin on the job counter (spin_us > 0) or after they sleep (0), every item once.
TEST(CpuThreadPool, SpinningAndSleepingWorkersRunEveryJob) {
  for (int64_t spin_us : {int64_t{0}, int64_t{2000}}) {
    ThreadPool pool(spin_us);
    for (int job = 0; job < 300; ++job) {
      const int64_t n = 1 + job % 7;
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(2, n, [&](int64_t item, int thread_id) {
        EXPECT_LT(thread_id, 2);
        hits[item].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "spin " << spin_us << " us, job " << job << ", item " << i;
      }
    }
  }  // each pool's destructor stops its workers, spinning or asleep
}

TEST(CpuThreadPool, SpinTimeFromTheEnvironment) {
  std::string error;
  EXPECT_EQ(spin_microseconds(nullptr, &error), 50);
  EXPECT_EQ(spin_microseconds("0", &error), 0);
  EXPECT_EQ(spin_microseconds("200", &error), 200);
  EXPECT_EQ(spin_microseconds("1000000", &error), 1000000);
  EXPECT_TRUE(error.empty()) << error;
  for (const char* bad : {"", "-1", "1000001", "5us", "abc", " 7"}) {
    error.clear();
    EXPECT_EQ(spin_microseconds(bad, &error), 50) << bad;
    EXPECT_NE(error.find(std::string("KVATTN_CPU_SPIN_US='") + bad + "'"), std::string::npos)
        << error;
    EXPECT_NE(error.find("from 0 (never spin) to 1000000"), std::string::npos) << error;
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
