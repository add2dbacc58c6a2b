// How the order of a paged read changes what DRAM gives (issue 23, Zen 4 note): 256 MiB of
// pages read by 2 threads, contiguously, page after page in a shuffled order, page after page
// with a software prefetch of the next page (T0 / T1) or two pages ahead, and 2 or 4 shuffled
// pages at a time line by line (the decode prefetcher's round-robin order, decode_prefetch.h).
// Not part of the build (a one-off measurement, every CPU class with AVX2):
//   g++ -O2 -mavx2 -std=c++20 -pthread bench/probes/paged_read_order.cc -o /tmp/paged_read_order
//   /tmp/paged_read_order [rounds=5] [page bytes=32768]
// Prints the median GB/s of each order over the rounds, the orders alternating within a round.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum Order { kContiguous, kPaged, kNextT0, kNextT1, kTwoAheadT0, kTwoAtOnce, kFourAtOnce, kOrders };
const char* const kNames[kOrders] = {"contiguous",         "paged",
                                     "paged, next by T0",  "paged, next by T1",
                                     "paged, +2 by T0",    "2 pages at once",
                                     "4 pages at once"};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const int64_t page = argc > 2 ? std::atol(argv[2]) : 32768;
  const int64_t pages = (int64_t{256} << 20) / page;
  auto* buf = static_cast<char*>(std::aligned_alloc(2 << 20, pages * page));
  std::memset(buf, 1, pages * page);
  std::vector<int64_t> in_order(pages);
  std::iota(in_order.begin(), in_order.end(), 0);
  std::vector<int64_t> shuffled = in_order;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(1));

  auto run = [&](Order order) {
    const std::vector<int64_t>& ids = order == kContiguous ? in_order : shuffled;
    const int ways = order == kTwoAtOnce ? 2 : order == kFourAtOnce ? 4 : 1;
    const int ahead = order == kTwoAheadT0 ? 2 : 1;
    const bool prefetch = order == kNextT0 || order == kNextT1 || order == kTwoAheadT0;
    int64_t sums[2] = {};
    std::vector<std::thread> threads;
    const double t0 = now();
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        __m256i acc = _mm256_setzero_si256();
        const int64_t begin = pages * t / 2, end = pages * (t + 1) / 2;
        for (int64_t i = begin; i + ways <= end; i += ways) {
          const char* p[4];
          for (int w = 0; w < ways; ++w) p[w] = buf + ids[i + w] * page;
          const char* next = prefetch && i + ahead < end ? buf + ids[i + ahead] * page : nullptr;
          for (int64_t o = 0; o < page; o += 64) {
            if (next != nullptr) {
              if (order == kNextT1) {
                _mm_prefetch(next + o, _MM_HINT_T1);
              } else {
                _mm_prefetch(next + o, _MM_HINT_T0);
              }
            }
            for (int w = 0; w < ways; ++w) {
              const auto* q = reinterpret_cast<const __m256i*>(p[w] + o);
              acc = _mm256_add_epi64(acc, _mm256_add_epi64(_mm256_load_si256(q),
                                                           _mm256_load_si256(q + 1)));
            }
          }
        }
        alignas(32) int64_t lanes[4];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
        sums[t] = lanes[0] + lanes[1] + lanes[2] + lanes[3];
      });
    }
    for (std::thread& th : threads) th.join();
    const double s = now() - t0;
    if (sums[0] + sums[1] == 42) std::printf("!");
    return static_cast<double>(pages * page) / s / 1e9;
  };

  std::vector<double> gbps[kOrders];
  for (int r = 0; r < rounds; ++r) {
    for (int o = 0; o < kOrders; ++o) gbps[o].push_back(run(Order(o)));
  }
  for (int o = 0; o < kOrders; ++o) {
    std::sort(gbps[o].begin(), gbps[o].end());
    std::printf("%-20s median %6.2f GB/s (min %6.2f, max %6.2f)\n", kNames[o],
                gbps[o][gbps[o].size() / 2], gbps[o].front(), gbps[o].back());
  }
  std::free(buf);
}
