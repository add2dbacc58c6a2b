#include "bench/harness.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "cpu/common/thread_pool.h"
#include "kvattn/attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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
const std::string& PreparedCase::kernel() const { return state_->plan.kernel; }
double PreparedCase::bytes() const { return static_cast<double>(state_->c->bytes_moved()); }
double PreparedCase::flops() const { return state_->c->flops(); }
int PreparedCase::threads() const { return state_->threads; }

namespace {

// A tile's K/V bytes as contiguous streams (64-byte aligned, whole lines), read line l of every
// stream in turn: the order the decode kernel's prefetcher asks for them (decode_prefetch.h).
// Reading the same shuffled 32 KiB pages one after another ran at 0.69 of the contiguous read on
// an AMD Zen 4 VM (19.8 vs 28.6 GB/s, 2 threads), four at a time line by line at 0.98 (28.0): the
// hardware prefetchers follow several streams at once, and a ceiling read one page at a time
// understates what the memory can give a paged reader.
struct Streams {
  static constexpr int kMax = 64;
  const std::byte* begin[kMax];
  int64_t lines[kMax];
  int count = 0;
  int64_t max_lines = 0;

  // Adds [p, p + n), merged with the previous stream when it continues it (n a multiple of 64 in
  // every paged decode case: rows of 64 x 16-bit or 128 x 8-bit elements and more). False, and
  // nothing added, when a new stream would be one too many: read these first.
  bool add(const std::byte* p, int64_t n) {
    if (count > 0 && begin[count - 1] + 64 * lines[count - 1] == p) {
      lines[count - 1] += n / 64;
    } else {
      if (count == kMax) return false;
      begin[count] = p;
      lines[count++] = n / 64;
    }
    max_lines = std::max(max_lines, lines[count - 1]);
    return true;
  }
};

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t sum_streams_avx512(const Streams& st) {
  __m512i acc = _mm512_setzero_si512();
  for (int64_t l = 0; l < st.max_lines; ++l) {
    for (int s = 0; s < st.count; ++s) {
      if (l < st.lines[s]) acc = _mm512_add_epi64(acc, _mm512_loadu_si512(st.begin[s] + 64 * l));
    }
  }
  // Summed as unsigned words: _mm512_reduce_add_epi64 adds signed 64-bit lanes, and the data's
  // sums overflow them (UBSan reports it).
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, acc);
  return std::accumulate(lanes, lanes + 8, uint64_t{0});
}

// Two 32-byte loads per line: the paged-read ceiling on AVX2-only CPUs (AMD Zen 3) reads every
// byte with vector loads as the kernel does, not one word per line.
__attribute__((target("avx2"))) uint64_t sum_streams_avx2(const Streams& st) {
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
  for (int64_t l = 0; l < st.max_lines; ++l) {
    for (int s = 0; s < st.count; ++s) {
      if (l >= st.lines[s]) continue;
      const std::byte* p = st.begin[s] + 64 * l;
      acc0 = _mm256_add_epi64(acc0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      acc1 = _mm256_add_epi64(acc1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    }
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(acc0, acc1));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

uint64_t sum_streams(const Streams& st) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx512) return sum_streams_avx512(st);
  if (avx2) return sum_streams_avx2(st);
#endif
  // Every byte, a word at a time (the compiler vectorizes this with the baseline ISA).
  uint64_t acc = 0;
  for (int64_t l = 0; l < st.max_lines; ++l) {
    for (int s = 0; s < st.count; ++s) {
      if (l >= st.lines[s]) continue;
      for (int i = 0; i < 64; i += 8) {
        uint64_t w;
        std::memcpy(&w, st.begin[s] + 64 * l + i, 8);
        acc += w;
      }
    }
  }
  return acc;
}

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
  std::vector<double> ms, cpu_ms, paired_gbps, paired_fraction;
  DramReader* const reader = bench_case.memory_bound ? rooflines.dram_reader : nullptr;
  for (int r = 0; r < repeats; ++r) {
    const double c0 = process_cpu_ms();
    const auto t0 = Clock::now();
    s = prepared.run_once();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    cpu_ms.push_back(process_cpu_ms() - c0);
    if (!s.ok()) return s;
    if (reader) {
      paired_gbps.push_back(reader->pass_gbps());
      paired_fraction.push_back(prepared.bytes() / (ms.back() * 1e6) / paired_gbps.back());
    }
  }
  if (reader) {
    result->dram_paired_gbps = median(paired_gbps);
    result->dram_paired_fraction = median(paired_fraction);
  }
  std::sort(ms.begin(), ms.end());
  result->median_cpu_ms = median(cpu_ms);
  CaseResult& r = *result;
  r.name = bench_case.name;
  r.backend = prepared.backend();
  r.kernel = prepared.kernel();
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
      bench_case.memory_bound ? r.gbps / rooflines.dram.gbps : r.gflops / compute_peak;
  if (bench_case.memory_bound) {
    r.paged_read_gbps = prepared.measure_paged_read_gbps(repeats);
    if (r.paged_read_gbps > 0) r.paged_read_fraction = r.gbps / r.paged_read_gbps;
  }
  return Status::Ok();
}


double PreparedCase::measure_paged_read_gbps(int repeats) {
  const Problem& p = state_->c->problem();
  const AttentionArgs& a = state_->args;
  if (p.op != Op::kBatchDecode || a.paged_k_cache.empty() || a.kv_indices.empty()) return 0;
  const bool nhd = p.kv_layout == KVLayout::kNHD;
  const TensorView& kc = a.paged_k_cache;
  const TensorView& vc = a.paged_v_cache;
  const int64_t elem = static_cast<int64_t>(dtype_size(p.kv_dtype));
  // Element strides of the page, token and head of each cache.
  auto strides = [&](const TensorView& t, int64_t* page, int64_t* token, int64_t* head) {
    *page = t.strides[0] * elem;
    *token = (nhd ? t.strides[1] : t.strides[2]) * elem;
    *head = (nhd ? t.strides[2] : t.strides[1]) * elem;
  };
  int64_t kp, kt, kh, vp, vt, vh;
  strides(kc, &kp, &kt, &kh);
  strides(vc, &vp, &vt, &vh);
  const int64_t k_row = p.head_dim_qk * elem, v_row = p.head_dim_vo * elem;
  const auto* indptr = a.kv_indptr.as<const int32_t>();
  const auto* indices = a.kv_indices.as<const int32_t>();
  const auto* last = a.kv_last_page_len.as<const int32_t>();
  // Tasks: (request, run of pages); long requests in chunks, as the kernel splits them.
  constexpr int64_t kChunkPages = 256;  // 4096 tokens at page 16
  struct Task {
    int request;
    int64_t first, end;  // page positions in the request's list
  };
  std::vector<Task> tasks;
  for (int b = 0; b < p.batch_size; ++b) {
    const int64_t pages = indptr[b + 1] - indptr[b];
    for (int64_t first = 0; first < pages; first += kChunkPages) {
      tasks.push_back({b, first, std::min(pages, first + kChunkPages)});
    }
  }
  const int threads = state_->threads;
  const auto* kbase = static_cast<const std::byte*>(kc.data);
  const auto* vbase = static_cast<const std::byte*>(vc.data);
  constexpr int64_t kTilePages = 2;  // the kernel's tile: 32 keys of pages of 16
  std::atomic<uint64_t> sink{0};
  double bytes = 0;
  for (const Task& t : tasks) {
    for (int64_t i = t.first; i < t.end; ++i) {
      const int64_t tokens =
          i + 1 == indptr[t.request + 1] - indptr[t.request] ? last[t.request] : p.page_size;
      bytes += static_cast<double>(tokens * p.num_kv_heads * (k_row + v_row));
    }
  }
  // Each task's tiles as streams, cut before the clock starts, so that the timed passes only read.
  // (Cut inside them, d 64's 512 row merges a tile were timed with its reads: on the Zen 4 VM,
  // three runs alternated, 2026-12-06, that ceiling read 20.8-23.4 GB/s at d 64 and 25.4-26.5 at
  // bf16 d 128; cut before, 23.4-30.9 and 25.5-29.8.)
  std::vector<std::vector<Streams>> task_tiles(tasks.size());
  for (std::size_t ti = 0; ti < tasks.size(); ++ti) {
    const Task& t = tasks[ti];
    const int64_t pages = indptr[t.request + 1] - indptr[t.request];
    for (int64_t i0 = t.first; i0 < t.end; i0 += kTilePages) {
      Streams st;
      for (const bool is_v : {false, true}) {
        for (int64_t i = i0; i < std::min(t.end, i0 + kTilePages); ++i) {
          const int64_t page = indices[indptr[t.request] + i];
          const int64_t tokens = i + 1 == pages ? last[t.request] : p.page_size;
          const std::byte* base = is_v ? vbase + page * vp : kbase + page * kp;
          const int64_t ts = is_v ? vt : kt, hs = is_v ? vh : kh;
          const int64_t row = is_v ? v_row : k_row;
          // Token-major (NHD) rows continue each other; head-major (HND): one stream a head.
          for (int h = 0; h < (nhd ? 1 : p.num_kv_heads); ++h) {
            for (int64_t s = 0; s < tokens; ++s) {
              for (int hh = nhd ? 0 : h; hh < (nhd ? p.num_kv_heads : h + 1); ++hh) {
                if (!st.add(base + s * ts + hh * hs, row)) {
                  task_tiles[ti].push_back(st);
                  st = Streams{};
                  st.add(base + s * ts + hh * hs, row);
                }
              }
            }
          }
        }
      }
      task_tiles[ti].push_back(st);
    }
  }
  std::vector<double> gbps;
  for (int r = 0; r < repeats + 1; ++r) {  // the first pass warms up
    const auto t0 = std::chrono::steady_clock::now();
    cpu::ThreadPool::global().parallel_for(threads, static_cast<int64_t>(tasks.size()),
                                           [&](int64_t task, int) {
                                             uint64_t acc = 0;
                                             for (const Streams& st : task_tiles[task])
                                               acc += sum_streams(st);
                                             sink.fetch_add(acc, std::memory_order_relaxed);
                                           });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) gbps.push_back(bytes / s / 1e9);
  }
  return sink.load() == 42 ? 0 : median(gbps);
}

}  // namespace kvattn::bench
