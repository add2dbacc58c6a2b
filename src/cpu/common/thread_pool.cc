#include "cpu/common/thread_pool.h"

#include <algorithm>

#if defined(__linux__)
#include <sched.h>
#endif

namespace kvattn::cpu {
namespace {

// Set on pool workers and on a caller while it runs a job, so nested parallel_for runs inline.
thread_local bool t_inside_job = false;

// A thread count large enough for any real machine; beyond it a request is clamped.
constexpr int kMaxThreads = 256;

int available_cores() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace

int resolve_num_threads(int requested) {
  static const int cores = available_cores();
  int n = requested > 0 ? requested : cores;
  return std::clamp(n, 1, kMaxThreads);
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool;
  return pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::ensure_workers(int count) {
  while (static_cast<int>(workers_.size()) < count) {
    int index = static_cast<int>(workers_.size());
    workers_.emplace_back([this, index] { worker_main(index); });
  }
}

void ThreadPool::worker_main(int worker_index) {
  t_inside_job = true;
  const int thread_id = worker_index + 1;  // the caller is thread 0
  uint64_t seen = 0;
  {
    // A worker created for a job already published must not wait for the next one.
    std::lock_guard<std::mutex> lock(mutex_);
    seen = generation_ - 1;
  }
  while (true) {
    std::unique_lock<std::mutex> lock(mutex_);
    work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    // A worker that wakes after the caller closed the job (every item taken) leaves it alone:
    // the caller does not wait for workers that never joined (a late wake-up, e.g. while another
    // runtime's threads spin on the cores, must not stall the job).
    if (thread_id >= job_threads_ || !job_open_) continue;
    ++workers_running_;
    ItemFn fn = fn_;
    void* context = context_;
    int64_t n = num_items_;
    lock.unlock();
    for (int64_t item; (item = next_item_.fetch_add(1, std::memory_order_relaxed)) < n;) {
      fn(context, item, thread_id);
    }
    lock.lock();
    if (--workers_running_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::run(int num_threads, int64_t num_items, ItemFn fn, void* context) {
  if (num_items <= 0) return;
  int threads = static_cast<int>(std::min<int64_t>(resolve_num_threads(num_threads), num_items));
  std::unique_lock<std::mutex> submit(submit_mutex_, std::defer_lock);
  if (threads <= 1 || t_inside_job || !submit.try_lock()) {
    for (int64_t item = 0; item < num_items; ++item) fn(context, item, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = fn;
    context_ = context;
    num_items_ = num_items;
    job_threads_ = threads;
    job_open_ = true;
    workers_running_ = 0;
    next_item_.store(0, std::memory_order_relaxed);
    ++generation_;
  }
  ensure_workers(threads - 1);
  work_cv_.notify_all();
  t_inside_job = true;
  for (int64_t item; (item = next_item_.fetch_add(1, std::memory_order_relaxed)) < num_items;) {
    fn(context, item, 0);
  }
  t_inside_job = false;
  // Every item is taken; wait only for the workers that joined and may still run one.
  std::unique_lock<std::mutex> lock(mutex_);
  job_open_ = false;
  done_cv_.wait(lock, [&] { return workers_running_ == 0; });
}

}  // namespace kvattn::cpu
