#include "cpu/common/thread_pool.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/status_macros.h"
#include "kvattn/cpu_threads.h"

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
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

// --- The host process's OpenMP runtime (kvattn/cpu_threads.h).

// The two entries kvattn calls: the GNU ABI that GCC's -fopenmp code calls (libgomp; LLVM's
// libomp and Intel's libiomp5 export it as well) and the thread number within the team.
struct HostOpenMp {
  void (*parallel)(void (*body)(void*), void* data, unsigned num_threads, unsigned flags) = nullptr;
  int (*thread_num)() = nullptr;
  std::string file;
};

std::atomic<CpuThreads> g_mode{CpuThreads::kOwnPool};
std::mutex g_host_mutex;
std::atomic<const HostOpenMp*> g_host{nullptr};  // found once, kept (and kept loaded) for good
std::atomic<uint64_t> g_host_missing_at{~uint64_t{0}};  // objects loaded at the last failed look

#if defined(__linux__)
bool is_openmp_runtime(std::string_view path) {
  const std::string_view base = path.substr(path.find_last_of('/') + 1);
  const bool named = base.starts_with("libgomp") || base.starts_with("libiomp5") ||
                     base.starts_with("libomp");
  return named && base.find(".so") != std::string_view::npos;
}

// Both entries of a loaded object, which stays loaded from then on (dlopen takes a reference).
const HostOpenMp* resolve(const char* file) {
  void* handle = dlopen(file, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* parallel = dlsym(handle, "GOMP_parallel");
  void* thread_num = dlsym(handle, "omp_get_thread_num");
  if (parallel == nullptr || thread_num == nullptr) {
    dlclose(handle);
    return nullptr;
  }
  auto* host = new HostOpenMp;
  host->parallel = reinterpret_cast<decltype(host->parallel)>(parallel);
  host->thread_num = reinterpret_cast<int (*)()>(thread_num);
  host->file = file;
  return host;
}

const HostOpenMp* look_up_host_openmp() {
  // The global scope first (an executable built with -fopenmp, a runtime in LD_PRELOAD as vLLM's
  // CPU worker has it): the runtime that scope's callers reach.
  if (void* symbol = dlsym(RTLD_DEFAULT, "GOMP_parallel")) {
    Dl_info info;
    if (dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) {
      if (const HostOpenMp* host = resolve(info.dli_fname)) return host;
    }
  }
  // Then one loaded privately (RTLD_LOCAL: Python loads torch, and torch its libgomp, so).
  std::vector<std::string> candidates;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        if (info->dlpi_name != nullptr && is_openmp_runtime(info->dlpi_name)) {
          static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &candidates);
  for (const std::string& file : candidates) {
    if (const HostOpenMp* host = resolve(file.c_str())) return host;
  }
  return nullptr;
}

// How many objects the process has loaded so far (glibc's dlpi_adds): a failed look is repeated
// only once it has changed, so kAuto costs one loader-lock round trip per job without a runtime.
uint64_t objects_loaded() {
  uint64_t adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t size, void* data) {
        if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds)) {
          *static_cast<uint64_t*>(data) = info->dlpi_adds;
        }
        return 1;  // the counters are the same in every entry
      },
      &adds);
  return adds;
}
#else
const HostOpenMp* look_up_host_openmp() { return nullptr; }
uint64_t objects_loaded() { return 0; }
#endif

const HostOpenMp* host_openmp() {
  if (const HostOpenMp* host = g_host.load(std::memory_order_acquire)) return host;
  const uint64_t loaded = objects_loaded();
  if (loaded == g_host_missing_at.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(g_host_mutex);
  if (const HostOpenMp* host = g_host.load(std::memory_order_acquire)) return host;
  const HostOpenMp* host = look_up_host_openmp();
  if (host != nullptr) {
    g_host.store(host, std::memory_order_release);
  } else {
    g_host_missing_at.store(loaded, std::memory_order_relaxed);
  }
  return host;
}

// A thread's share of a job: items from `counter` until none is left, each claiming its
// successor first where job.ahead says so (ThreadPool::parallel_for_ahead). The one item loop of
// the pool's threads, the caller, the host's team and a job run inline.
void take_items(const ThreadPool::Job& job, std::atomic<int64_t>& counter, int thread_id) {
  const int64_t n = job.num_items;
  bool claimed = false;
  for (int64_t item = counter.fetch_add(1, std::memory_order_relaxed); item < n;) {
    int64_t next = -1;
    if (job.ahead != nullptr && job.ahead(job.context, item)) {
      next = counter.fetch_add(1, std::memory_order_relaxed);
      if (next >= n) next = -1;
    }
    job.fn(job.context, item, next, claimed, thread_id);
    claimed = next >= 0;
    item = claimed ? next : counter.fetch_add(1, std::memory_order_relaxed);
  }
}

// One job on the host's team: each thread takes items until none is left.
struct HostJob {
  const ThreadPool::Job* job;
  int (*thread_num)();
  std::atomic<int64_t> next{0};
};

void host_team_body(void* data) {
  auto* host_job = static_cast<HostJob*>(data);
  const bool was_inside = t_inside_job;
  t_inside_job = true;
  take_items(*host_job->job, host_job->next, host_job->thread_num());
  t_inside_job = was_inside;
}

// Spins until ready() holds or `ns` nanoseconds have passed, yielding the core every 32 pauses.
template <class Ready>
void spin_until(Ready ready, int64_t ns) {
  if (ns <= 0) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (true) {
    for (int i = 0; i < 32; ++i) {
      if (ready()) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= end) return;
    // A thread of the host's waiting for this core gets it first (the wake-up latency of a
    // spinning worker stays: 2 threads, B2 x 16 / 256 keys 0.008 / 0.047-0.051 ms a call either
    // way).
    std::this_thread::yield();
  }
}

}  // namespace

int64_t spin_microseconds(const char* value, std::string* error) {
  constexpr int64_t kDefault = 50, kMax = 1000000;
  if (value == nullptr) return kDefault;
  const std::string_view text(value);
  int64_t us = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), us);
  if (ec != std::errc() || end != text.data() + text.size() || us < 0 || us > kMax) {
    if (error != nullptr) {
      *error = "KVATTN_CPU_SPIN_US='" + std::string(text) +
               "': must be whole microseconds from 0 (never spin) to 1000000; using " +
               std::to_string(kDefault);
    }
    return kDefault;
  }
  return us;
}

int resolve_num_threads(int requested) {
  static const int cores = available_cores();
  int n = requested > 0 ? requested : cores;
  return std::clamp(n, 1, kMaxThreads);
}

ThreadPool::ThreadPool(int64_t spin_us) {
  if (spin_us < 0) {
    std::string error;
    spin_us = spin_microseconds(std::getenv("KVATTN_CPU_SPIN_US"), &error);
    if (!error.empty()) std::fprintf(stderr, "kvattn: %s\n", error.c_str());
  }
  spin_ns_wanted_ = spin_us * 1000;
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
  if (static_cast<int>(workers_.size()) >= count) return;
  // More threads than cores: a spinning worker would hold a core another one needs.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    spin_ns_ = count + 1 <= resolve_num_threads(0) ? spin_ns_wanted_ : 0;
  }
  while (static_cast<int>(workers_.size()) < count) {
    int index = static_cast<int>(workers_.size());
    workers_.emplace_back([this, index] { worker_main(index); });
  }
}

void ThreadPool::worker_main(int worker_index) {
  t_inside_job = true;
  const int thread_id = worker_index + 1;  // the caller is thread 0
  uint64_t seen = 0;
  int64_t spin_ns = 0;
  {
    // A worker created for a job already published must not wait for the next one.
    std::lock_guard<std::mutex> lock(mutex_);
    seen = generation_ - 1;
  }
  while (true) {
    spin_until([&] { return published_generation_.load(std::memory_order_acquire) != seen; },
               spin_ns);
    std::unique_lock<std::mutex> lock(mutex_);
    spin_ns = spin_ns_;
    work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    // A worker that wakes after the caller closed the job (every item taken) leaves it alone:
    // the caller does not wait for workers that never joined (a late wake-up, e.g. while another
    // runtime's threads spin on the cores, must not stall the job).
    if (thread_id >= job_threads_ || !job_open_) continue;
    published_running_.store(++workers_running_, std::memory_order_relaxed);
    const Job job = job_;
    lock.unlock();
    take_items(job, next_item_, thread_id);
    lock.lock();
    published_running_.store(--workers_running_, std::memory_order_release);
    if (workers_running_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::run(int num_threads, const Job& job) {
  if (job.num_items <= 0) return;
  // The same count either way: callers size per-thread scratch for it.
  const int threads =
      static_cast<int>(std::min<int64_t>(resolve_num_threads(num_threads), job.num_items));
  const CpuThreads mode = g_mode.load(std::memory_order_relaxed);
  if (threads > 1 && !t_inside_job && mode != CpuThreads::kOwnPool) {
    if (const HostOpenMp* host = host_openmp()) {
      HostJob host_job{&job, host->thread_num};
      host->parallel(&host_team_body, &host_job, static_cast<unsigned>(threads), 0);
      return;
    }
  }
  run_own(threads, job);
}

void ThreadPool::run_own(int threads, const Job& job) {
  std::unique_lock<std::mutex> submit(submit_mutex_, std::defer_lock);
  if (threads <= 1 || t_inside_job || !submit.try_lock()) {
    std::atomic<int64_t> counter{0};
    take_items(job, counter, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = job;
    job_threads_ = threads;
    job_open_ = true;
    workers_running_ = 0;
    published_running_.store(0, std::memory_order_relaxed);
    next_item_.store(0, std::memory_order_relaxed);
    ++generation_;
    published_generation_.store(generation_, std::memory_order_release);
  }
  ensure_workers(threads - 1);
  work_cv_.notify_all();
  t_inside_job = true;
  take_items(job, next_item_, 0);
  t_inside_job = false;
  // Every item is taken; wait only for the workers that joined and may still run one: spinning
  // first, as they do between jobs, then asleep. (Asleep at once, the caller's own wake-up took
  // ~25 us on the Zen 4 VM: two items of 30 us, back to back, 58 us a job; spinning, 31.)
  int64_t spin_ns = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_open_ = false;
    if (workers_running_ > 0) spin_ns = spin_ns_;
  }
  spin_until([&] { return published_running_.load(std::memory_order_acquire) == 0; }, spin_ns);
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return workers_running_ == 0; });
}

}  // namespace kvattn::cpu

namespace kvattn {

Status set_cpu_threads(CpuThreads mode) {
  if (mode == CpuThreads::kHostOpenMp && cpu::host_openmp() == nullptr) {
    return make_error(ErrorCode::kUnavailable,
                      "set_cpu_threads: kHostOpenMp needs an OpenMP runtime loaded in this process "
                      "(GOMP_parallel and omp_get_thread_num of libgomp, libomp or libiomp5); "
                      "none is: use kOwnPool, or kAuto to take one when it is loaded");
  }
  cpu::g_mode.store(mode, std::memory_order_relaxed);
  return Status::Ok();
}

CpuThreads cpu_threads() { return cpu::g_mode.load(std::memory_order_relaxed); }

std::string_view cpu_threads_name(CpuThreads mode) {
  switch (mode) {
    case CpuThreads::kOwnPool:
      return "own";
    case CpuThreads::kHostOpenMp:
      return "openmp";
    case CpuThreads::kAuto:
      break;
  }
  return "auto";
}

Status set_cpu_threads(std::string_view mode) {
  for (CpuThreads m : {CpuThreads::kOwnPool, CpuThreads::kHostOpenMp, CpuThreads::kAuto}) {
    if (mode == cpu_threads_name(m)) return set_cpu_threads(m);
  }
  return make_error(ErrorCode::kInvalidArgument, "cpu_threads: '", mode,
                    "': must be \"own\", \"openmp\" or \"auto\"");
}

std::string host_openmp_runtime() {
  const cpu::HostOpenMp* host = cpu::host_openmp();
  return host != nullptr ? host->file : std::string();
}

}  // namespace kvattn
