#include "bench/harness.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/thread_pool.h"
#include "kvattn/attention.h"

namespace kvattn::bench {

namespace {

// A buffer on transparent huge pages where the kernel allows them (madvise mode), as a serving
// engine's KV pool would be: with 4 KiB pages a decode over a 268 MB cache pays a TLB miss on
// almost every 256-byte row of a head.
struct HugeBuffer {
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  explicit HugeBuffer(std::size_t n) : bytes((n + kHugePage - 1) / kHugePage * kHugePage) {
    data = static_cast<std::byte*>(std::aligned_alloc(kHugePage, bytes));
#if defined(MADV_HUGEPAGE)
    if (data) madvise(data, bytes, MADV_HUGEPAGE);
#endif
  }
  ~HugeBuffer() { std::free(data); }
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
};

}  // namespace

struct PreparedCase::State {
  std::vector<std::unique_ptr<HugeBuffer>> huge;
  std::optional<testing::Case> c;
  AttentionArgs args;
  Plan plan;
  std::vector<std::byte> workspace;
  int threads = 1;
};

PreparedCase::PreparedCase() = default;
PreparedCase::~PreparedCase() { delete state_; }
PreparedCase::PreparedCase(PreparedCase&& o) noexcept : state_(o.state_) { o.state_ = nullptr; }
PreparedCase& PreparedCase::operator=(PreparedCase&& o) noexcept {
  std::swap(state_, o.state_);
  return *this;
}

Status PreparedCase::prepare(const BenchCase& bench_case, const std::string& backend,
                             int num_threads, PreparedCase* out) {
  auto state = std::make_unique<State>();
  state->c.emplace(testing::Case::make(bench_case.spec));
  state->args = state->c->args();
  // Move the K/V buffers onto huge pages and point the views there.
  for (std::vector<std::byte>* buffer :
       {&state->c->kv_cache, &state->c->k_cache, &state->c->v_cache, &state->c->k, &state->c->v,
        &state->c->k_scale_cache, &state->c->v_scale_cache}) {
    // (MLA: k_cache / v_cache hold the ckv / kpe caches.)
    if (buffer->size() < HugeBuffer::kHugePage) continue;
    auto huge = std::make_unique<HugeBuffer>(buffer->size());
    if (!huge->data) continue;
    std::memcpy(huge->data, buffer->data(), buffer->size());
    const std::byte* begin = buffer->data();
    for (TensorView* view :
         {&state->args.paged_k_cache, &state->args.paged_v_cache, &state->args.k, &state->args.v,
          &state->args.k_scale_cache, &state->args.v_scale_cache, &state->args.ckv_cache,
          &state->args.kpe_cache}) {
      auto* p = static_cast<std::byte*>(view->data);
      if (p >= begin && p < begin + buffer->size()) view->data = huge->data + (p - begin);
    }
    state->huge.push_back(std::move(huge));
  }
  PlanOptions options;
  options.backend = backend;
  options.num_threads = num_threads;
  Status s = plan(bench_case.spec.problem, state->args, options, &state->plan);
  if (!s.ok()) return s;
  state->workspace.resize(state->plan.workspace_bytes);
  state->threads = state->plan.backend == "cpu" ? state->plan.num_threads : 1;
  delete out->state_;
  out->state_ = state.release();
  return Status::Ok();
}

Status PreparedCase::run_once() {
  return run(state_->plan, state_->args, state_->workspace.data(), state_->workspace.size());
}
const std::string& PreparedCase::backend() const { return state_->plan.backend; }
double PreparedCase::bytes() const { return static_cast<double>(state_->c->bytes_moved()); }
double PreparedCase::flops() const { return state_->c->flops(); }
int PreparedCase::threads() const { return state_->threads; }

namespace {

double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

Status time_case(const BenchCase& bench_case, PreparedCase& prepared, int repeats,
                 const Rooflines& rooflines, CaseResult* result) {
  using Clock = std::chrono::steady_clock;
  Status s = prepared.run_once();  // warm-up: pages faulted in, pool threads started
  if (!s.ok()) return s;
  std::vector<double> ms, cpu_ms;
  for (int r = 0; r < repeats; ++r) {
    const double c0 = process_cpu_ms();
    const auto t0 = Clock::now();
    s = prepared.run_once();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    cpu_ms.push_back(process_cpu_ms() - c0);
    if (!s.ok()) return s;
  }
  std::sort(ms.begin(), ms.end());
  result->median_cpu_ms = median(cpu_ms);
  CaseResult& r = *result;
  r.name = bench_case.name;
  r.backend = prepared.backend();
  r.repeats = repeats;
  r.threads = prepared.threads();
  r.median_ms = median(ms);
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  r.bytes = prepared.bytes();
  r.flops = prepared.flops();
  const double seconds = r.median_ms / 1e3;
  r.gbps = r.bytes / seconds / 1e9;
  r.gflops = r.flops / seconds / 1e9;
  // The peak of the unit the case's kernel runs on: AMX tiles, else bf16 dot products, else FMA.
  double compute_peak = rooflines.fma_gflops;
  if (bench_case.bf16_dot && rooflines.bf16_dot_gflops > 0) compute_peak = rooflines.bf16_dot_gflops;
  if (bench_case.bf16_dot && rooflines.amx_bf16_gflops > 0) compute_peak = rooflines.amx_bf16_gflops;
  r.roofline_fraction =
      bench_case.memory_bound ? r.gbps / rooflines.dram_gbps : r.gflops / compute_peak;
  return Status::Ok();
}

}  // namespace kvattn::bench
