// A persistent pool of worker threads for the CPU backend. One job runs at a time; the calling
// thread takes part as thread 0, so `thread_id` indexes per-thread scratch in [0, threads).
// Where kvattn::set_cpu_threads asks for it (kvattn/cpu_threads.h), a job runs on the OpenMP
// team of the host process instead (omp_get_thread_num() is then the thread id).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvattn::cpu {

// The threads a request for `requested` threads gets: 0 means every core this process may run on.
int resolve_num_threads(int requested);

class ThreadPool {
 public:
  using ItemFn = void (*)(void* context, int64_t item, int thread_id);

  // The process-wide pool (workers start on first use and live until exit).
  static ThreadPool& global();

  ThreadPool() = default;
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Calls fn(item, thread_id) for every item in [0, num_items) on up to `num_threads` threads
  // (0: all cores), items handed out dynamically, and returns when all are done. Called from
  // inside a job, or while another thread's job runs, it runs the items on the calling thread.
  template <class Fn>
  void parallel_for(int num_threads, int64_t num_items, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(
        num_threads, num_items,
        [](void* context, int64_t item, int thread_id) {
          (*static_cast<F*>(context))(item, thread_id);
        },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  void run(int num_threads, int64_t num_items, ItemFn fn, void* context);

 private:
  void run_own(int threads, int64_t num_items, ItemFn fn, void* context);
  void worker_main(int worker_index);
  void ensure_workers(int count);  // under submit_mutex_

  std::mutex submit_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<std::thread> workers_;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  // The current job; written under mutex_ before generation_ changes.
  ItemFn fn_ = nullptr;
  void* context_ = nullptr;
  int64_t num_items_ = 0;
  int job_threads_ = 0;
  bool job_open_ = false;    // workers may still join the current job
  int workers_running_ = 0;  // workers that joined the current job and have not left it
  std::atomic<int64_t> next_item_{0};
};

}  // namespace kvattn::cpu
