// A persistent pool of worker threads for the CPU backend. One job runs at a time; the calling
// thread takes part as thread 0, so `thread_id` indexes per-thread scratch in [0, threads).
// Between jobs a worker spins on the job counter for a while (KVATTN_CPU_SPIN_US, 50 us by
// default), and the caller as long on the workers' count at the end of a job, before either sleeps
// on a condition variable: a serving engine's kvattn calls of one layer come back to back (RoPE,
// append, decode, merge), and on a Zen 4 VM a sleeping worker woke too late to take its share and
// a sleeping caller ~25 us late (2026-12-06: two threads, B2 x 256 keys bf16 d128 decode 0.094 ->
// 0.046 ms a call; bench/probes/pool_latency.cc).
// Where kvattn::set_cpu_threads asks for it (kvattn/cpu_threads.h), a job runs on the OpenMP
// team of the host process instead (omp_get_thread_num() is then the thread id).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvattn::cpu {

// The threads a request for `requested` threads gets: 0 means every core this process may run on.
int resolve_num_threads(int requested);

// How long a worker spins for its next job, and a caller for its workers to finish, before it
// sleeps, from KVATTN_CPU_SPIN_US (`value`, null when unset): whole microseconds, 0 (never spin)
// to 1000000; unset, 50. Anything else is reported (`error`: the variable, the value and the
// rule) and the default kept.
int64_t spin_microseconds(const char* value, std::string* error);

class ThreadPool {
 public:
  // One job's items: fn(context, item, next, claimed, thread_id) for each; ahead (may be null)
  // says which items claim their successor before they run (parallel_for_ahead).
  using ItemFn = void (*)(void* context, int64_t item, int64_t next, bool claimed, int thread_id);
  using AheadFn = bool (*)(void* context, int64_t item);
  struct Job {
    ItemFn fn = nullptr;
    AheadFn ahead = nullptr;
    void* context = nullptr;
    int64_t num_items = 0;
  };

  // The process-wide pool (workers start on first use and live until exit).
  static ThreadPool& global();

  // spin_us < 0: KVATTN_CPU_SPIN_US (spin_microseconds).
  explicit ThreadPool(int64_t spin_us = -1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Calls fn(item, thread_id) for every item in [0, num_items) on up to `num_threads` threads
  // (0: all cores), items handed out dynamically, and returns when all are done. Called from
  // inside a job, or while another thread's job runs, it runs the items on the calling thread.
  template <class Fn>
  void parallel_for(int num_threads, int64_t num_items, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(num_threads, Job{[](void* context, int64_t item, int64_t, bool, int thread_id) {
                           (*static_cast<F*>(context))(item, thread_id);
                         },
                         nullptr, const_cast<void*>(static_cast<const void*>(&fn)), num_items});
  }

  // parallel_for for items that want to know, while they run, which item their thread runs next
  // (a decode task asks for the next one's first KV lines during its last tile): a thread about
  // to run an item for which ahead(item) holds first claims its next item and passes it as
  // fn(item, next, claimed, thread_id)'s `next` (-1 where none is left, or where ahead(item) is
  // false: the thread then claims after fn returns, so that a long item does not hold one back
  // while the other threads run out of work); `claimed` says that the item was claimed so, as
  // the `next` of the item its thread ran before it.
  template <class Ahead, class Fn>
  void parallel_for_ahead(int num_threads, int64_t num_items, Ahead&& ahead, Fn&& fn) {
    using A = std::remove_reference_t<Ahead>;
    using F = std::remove_reference_t<Fn>;
    struct Context {
      A* ahead;
      F* fn;
    } context{&ahead, &fn};
    run(num_threads,
        Job{[](void* c, int64_t item, int64_t next, bool claimed, int thread_id) {
              (*static_cast<Context*>(c)->fn)(item, next, claimed, thread_id);
            },
            [](void* c, int64_t item) -> bool { return (*static_cast<Context*>(c)->ahead)(item); },
            &context, num_items});
  }

  void run(int num_threads, const Job& job);

 private:
  void run_own(int threads, const Job& job);
  void worker_main(int worker_index);
  void ensure_workers(int count);  // under submit_mutex_

  std::mutex submit_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<std::thread> workers_;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  // The current job; written under mutex_ before generation_ changes.
  Job job_;
  int job_threads_ = 0;
  bool job_open_ = false;    // workers may still join the current job
  int workers_running_ = 0;  // workers that joined the current job and have not left it
  std::atomic<int64_t> next_item_{0};
  // generation_ and workers_running_ as spinning threads read them without mutex_ (stored under
  // it, after each change).
  std::atomic<uint64_t> published_generation_{0};
  std::atomic<int> published_running_{0};
  // A worker's spin between jobs, and the caller's for the workers to finish; 0 where the pool has
  // more threads than cores.
  int64_t spin_ns_ = 0;
  int64_t spin_ns_wanted_ = 0;
};

}  // namespace kvattn::cpu
