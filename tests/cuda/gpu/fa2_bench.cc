// fa2's GPU benchmarks (DESIGN.md §5): batch decode of the founding case (bf16 q over an e4m3
// paged cache, d128, GQA 32/8) in GB/s next to the device-to-device copy bandwidth measured in
// the same run, and causal batch prefill in TFLOP/s. Usage: kvattn_fa2_gpu_bench [--quick]
// [--backend fa3]: with fa3 (SM90 only), causal bf16 d128 prefill alone (fa3 has no decode
// kernel, and bf16 q over an FP8 cache is not fa3's), up to 8k tokens. Without a suitable CUDA
// device it says why and exits 0 (nothing measured). The profile summary (issue 13, no ncu):
// achieved bandwidth per decode case, TFLOP/s per prefill case, and at batch 1 x 32k the split-KV
// merge's time against the attention kernel's (CUDA events around each launch of run, through
// fa2's RuntimeCalls), and run captured in a CUDA graph and replayed.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_query.h"
#include "cuda/common/bench_timing.h"
#include "cuda/fa2/runtime_calls.h"
#include "cuda/gpu/device_mirror.h"
#include "kvattn/kvattn.h"

namespace kvattn::fa2::test {
namespace {

using cuda::test::copy_bandwidth_gbs;
using cuda::test::device_alloc;
using cuda::test::on_device;
using cuda::test::time_ms;

struct PagedBatch {
  Problem problem;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, last;
  std::vector<void*> buffers;
  AttentionArgs args;
  int64_t bytes = 0;
  double flops = 0;
};

PagedBatch make_batch(Op op, int batch, int64_t qo_len, int64_t kv_len, DType kv_dtype) {
  PagedBatch b;
  Problem& p = b.problem;
  p.op = op;
  p.batch_size = batch;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = p.head_dim_vo = 128;
  p.page_size = 16;
  p.q_dtype = p.o_dtype = DType::kBF16;
  p.kv_dtype = kv_dtype;
  if (op == Op::kBatchPrefillPaged) p.mask_mode = MaskMode::kCausal;
  const int64_t pages_per = (kv_len + p.page_size - 1) / p.page_size;
  const int64_t pages = pages_per * batch;
  b.kv_indptr.push_back(0);
  b.qo_indptr.push_back(0);
  for (int i = 0; i < batch; ++i) {
    b.kv_indptr.push_back(int32_t((i + 1) * pages_per));
    b.qo_indptr.push_back(int32_t((i + 1) * qo_len));
    b.last.push_back(int32_t(kv_len - (pages_per - 1) * p.page_size));
  }
  for (int64_t i = 0; i < pages; ++i) b.kv_indices.push_back(int32_t(i));
  const int64_t rows = op == Op::kBatchDecode ? batch : batch * qo_len;
  const size_t kv_bytes = size_t(pages) * p.page_size * 8 * 128 * dtype_size(kv_dtype);
  void* q = device_alloc(size_t(rows) * 32 * 128 * 2, 0x3c);
  void* k = device_alloc(kv_bytes, 0x30);
  void* v = device_alloc(kv_bytes, 0x30);
  void* o = device_alloc(size_t(rows) * 32 * 128 * 2, 0);
  b.buffers = {q, k, v, o};
  AttentionArgs& a = b.args;
  a.q = op == Op::kBatchDecode ? on_device(q, DType::kBF16, {batch, 32, 128})
                               : on_device(q, DType::kBF16, {rows, 32, 128});
  a.out = op == Op::kBatchDecode ? on_device(o, DType::kBF16, {batch, 32, 128})
                                 : on_device(o, DType::kBF16, {rows, 32, 128});
  a.paged_k_cache = on_device(k, kv_dtype, {pages, 16, 8, 128});
  a.paged_v_cache = on_device(v, kv_dtype, {pages, 16, 8, 128});
  a.kv_indptr = TensorView::contiguous(b.kv_indptr.data(), DType::kI32, {batch + 1});
  a.kv_indices = TensorView::contiguous(b.kv_indices.data(), DType::kI32, {pages});
  a.kv_last_page_len = TensorView::contiguous(b.last.data(), DType::kI32, {batch});
  if (op != Op::kBatchDecode) {
    a.qo_indptr = TensorView::contiguous(b.qo_indptr.data(), DType::kI32, {batch + 1});
  }
  b.bytes = int64_t(2 * kv_bytes) + 2 * rows * 32 * 128 * 2;
  const double lq = double(op == Op::kBatchDecode ? 1 : qo_len), lkv = double(kv_len);
  const double pairs = p.mask_mode == MaskMode::kCausal ? (2 * lkv - lq) * lq : 2 * lq * lkv;
  b.flops = double(batch) * pairs * 32 * (128 + 128);
  return b;
}

double run_ms(PagedBatch& b, const std::string& backend, const Device& device, int iters) {
  PlanOptions options;
  options.backend = backend;
  options.device = device;
  Plan plan;
  Status st = kvattn::plan(b.problem, b.args, options, &plan);
  if (!st.ok()) {
    std::fprintf(stderr, "plan: %s\n", st.message().c_str());
    std::exit(1);
  }
  double ms = time_ms(
      [&] {
        Status s = kvattn::run(plan, b.args);
        if (!s.ok()) {
          std::fprintf(stderr, "run: %s\n", s.message().c_str());
          std::exit(1);
        }
      },
      iters);
  for (void* p : b.buffers) KVATTN_BENCH_CHECK(cudaFree(p));
  return ms;
}

// The real runtime with an event pair around every launch: each kernel's own GPU time.
class TimedLaunches final : public RuntimeCalls {
 public:
  explicit TimedLaunches(RuntimeCalls& real) : real_(real) {}
  ~TimedLaunches() override {
    for (auto& [a, b] : events_) {
      (void)cudaEventDestroy(a);
      (void)cudaEventDestroy(b);
    }
  }
  int get_device(int* d) override { return real_.get_device(d); }
  int set_device(int d) override { return real_.set_device(d); }
  int sm_count(int d, int* c) override { return real_.sm_count(d, c); }
  int malloc_device(void** p, size_t n) override { return real_.malloc_device(p, n); }
  int free_device(void* p) override { return real_.free_device(p); }
  int malloc_pinned(void** p, size_t n) override { return real_.malloc_pinned(p, n); }
  int free_pinned(void* p) override { return real_.free_pinned(p); }
  int malloc_async(void** p, size_t n, void* s) override { return real_.malloc_async(p, n, s); }
  int free_async(void* p, void* s) override { return real_.free_async(p, s); }
  int copy_to_device_async(void* d, const void* h, size_t n, void* s) override {
    return real_.copy_to_device_async(d, h, n, s);
  }
  int stream_synchronize(void* s) override { return real_.stream_synchronize(s); }
  int set_max_dynamic_shared_memory(const void* k, int n) override {
    return real_.set_max_dynamic_shared_memory(k, n);
  }
  int launch(const void* kernel, Dim3 grid, Dim3 block, void** args, size_t smem,
             void* stream) override {
    cudaEvent_t a, b;
    KVATTN_BENCH_CHECK(cudaEventCreate(&a));
    KVATTN_BENCH_CHECK(cudaEventCreate(&b));
    KVATTN_BENCH_CHECK(cudaEventRecord(a, static_cast<cudaStream_t>(stream)));
    const int err = real_.launch(kernel, grid, block, args, smem, stream);
    KVATTN_BENCH_CHECK(cudaEventRecord(b, static_cast<cudaStream_t>(stream)));
    events_.emplace_back(a, b);
    return err;
  }
  const char* error_string(int e) override { return real_.error_string(e); }

  // Milliseconds of launch `k` of every run, averaged over the runs recorded.
  double mean_ms(int k, int launches_per_run) {
    KVATTN_BENCH_CHECK(cudaDeviceSynchronize());
    double total = 0;
    int n = 0;
    for (size_t i = size_t(k); i < events_.size(); i += size_t(launches_per_run), ++n) {
      float ms = 0;
      KVATTN_BENCH_CHECK(cudaEventElapsedTime(&ms, events_[i].first, events_[i].second));
      total += ms;
    }
    return n ? total / n : 0.0;
  }
  size_t launches() const { return events_.size(); }

 private:
  RuntimeCalls& real_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
};

// Batch 1 x 32k decode (the planner splits it): attention vs merge time, and run captured in a
// CUDA graph on a non-default stream and replayed.
void profile_long_decode(const Device& device, int iters) {
  PagedBatch b = make_batch(Op::kBatchDecode, 1, 1, 32768, DType::kBF16);
  cudaStream_t stream;
  KVATTN_BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  PlanOptions options;
  options.backend = "fa2";
  options.device = device;
  options.stream = stream;
  Plan plan;
  Status st = kvattn::plan(b.problem, b.args, options, &plan);
  if (!st.ok()) {
    std::fprintf(stderr, "plan: %s\n", st.message().c_str());
    std::exit(1);
  }
  {
    TimedLaunches timed(runtime());
    RuntimeCalls* previous = substitute_runtime(&timed);
    for (int i = 0; i < iters; ++i) {
      st = kvattn::run(plan, b.args);
      if (!st.ok()) break;
    }
    substitute_runtime(previous);
    if (!st.ok()) {
      std::fprintf(stderr, "run: %s\n", st.message().c_str());
      std::exit(1);
    }
    const int per_run = int(timed.launches()) / iters;
    const double attention = timed.mean_ms(0, per_run);
    const double merge = per_run > 1 ? timed.mean_ms(1, per_run) : 0.0;
    std::printf(
        "profile decode B=1 kv_len=32768 (split into %lld-key chunks, %lld partial states): "
        "attention %.3f ms, merge %.3f ms (%.0f%% of the pair)\n",
        (long long)plan.kv_chunk_size, (long long)plan.num_partial_states, attention, merge,
        100.0 * merge / (attention + merge));
  }
  // Graph capture: run issues only launches on `stream`, so it can be captured and replayed.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KVATTN_BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  st = kvattn::run(plan, b.args);
  KVATTN_BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  if (!st.ok()) {
    std::fprintf(stderr, "run under capture: %s\n", st.message().c_str());
    std::exit(1);
  }
  KVATTN_BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t a, e;
  KVATTN_BENCH_CHECK(cudaEventCreate(&a));
  KVATTN_BENCH_CHECK(cudaEventCreate(&e));
  KVATTN_BENCH_CHECK(cudaGraphLaunch(exec, stream));
  KVATTN_BENCH_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < iters; ++i) KVATTN_BENCH_CHECK(cudaGraphLaunch(exec, stream));
  KVATTN_BENCH_CHECK(cudaEventRecord(e, stream));
  KVATTN_BENCH_CHECK(cudaEventSynchronize(e));
  float ms = 0;
  KVATTN_BENCH_CHECK(cudaEventElapsedTime(&ms, a, e));
  std::printf("profile decode B=1 kv_len=32768 as a CUDA graph: %.3f ms per replay\n", ms / iters);
  KVATTN_BENCH_CHECK(cudaGraphExecDestroy(exec));
  KVATTN_BENCH_CHECK(cudaGraphDestroy(graph));
  KVATTN_BENCH_CHECK(cudaEventDestroy(a));
  KVATTN_BENCH_CHECK(cudaEventDestroy(e));
  KVATTN_BENCH_CHECK(cudaStreamDestroy(stream));
  for (void* p : b.buffers) KVATTN_BENCH_CHECK(cudaFree(p));
}

int bench_fa3(bool quick) {
  std::string why;
  std::optional<Device> device = gpu_or_reason(&why, 90, 90);
  if (!device) {
    std::printf("fa3 GPU benchmarks skipped: %s\n", why.c_str());
    return 0;
  }
  std::printf("device %s, backend fa3\n", device->to_string().c_str());
  for (auto [batch, len] :
       {std::pair{4, int64_t(4096)}, std::pair{1, int64_t(8192)}, std::pair{1, int64_t(16384)}}) {
    PagedBatch b = make_batch(Op::kBatchPrefillPaged, batch, len, len, DType::kBF16);
    const double flops = b.flops;
    const double ms = run_ms(b, "fa3", *device, quick ? 2 : 5);
    std::printf("fa3 prefill causal q bf16 kv bf16 B=%d len=%-6lld %8.3f ms %7.1f TFLOP/s\n", batch,
                (long long)len, ms, flops / (ms * 1e-3) / 1e12);
  }
  return 0;
}

int bench_main(bool quick) {
  std::string why;
  std::optional<Device> device = gpu_or_reason(&why);
  if (!device) {
    std::printf("fa2 GPU benchmarks skipped: %s\n", why.c_str());
    return 0;
  }
  const int iters = quick ? 5 : 20;
  const double copy = copy_bandwidth_gbs();
  std::printf("device %s, copy bandwidth (D2D, read+write) %.0f GB/s\n",
              device->to_string().c_str(), copy);
  for (DType kv : {DType::kE4M3, DType::kBF16}) {
    for (auto [batch, len] : {std::pair{64, int64_t(4096)}, std::pair{8, int64_t(32768)}}) {
      PagedBatch b = make_batch(Op::kBatchDecode, batch, 1, len, kv);
      const double bytes = double(b.bytes);
      const double ms = run_ms(b, "fa2", *device, iters);
      const double gbs = bytes / (ms * 1e-3) / 1e9;
      std::printf(
          "decode  q bf16 kv %-4s B=%-3d kv_len=%-6lld %8.3f ms %7.0f GB/s (%.0f%% of copy)\n",
          std::string(dtype_name(kv)).c_str(), batch, (long long)len, ms, gbs, 100.0 * gbs / copy);
    }
  }
  for (DType kv : {DType::kBF16, DType::kE4M3}) {
    for (auto [batch, len] : {std::pair{4, int64_t(4096)}, std::pair{1, int64_t(16384)}}) {
      PagedBatch b = make_batch(Op::kBatchPrefillPaged, batch, len, len, kv);
      const double flops = b.flops;
      const double ms = run_ms(b, "fa2", *device, quick ? 2 : 5);
      std::printf("prefill causal q bf16 kv %-4s B=%d len=%-6lld %8.3f ms %7.1f TFLOP/s\n",
                  std::string(dtype_name(kv)).c_str(), batch, (long long)len, ms,
                  flops / (ms * 1e-3) / 1e12);
    }
  }
  profile_long_decode(*device, iters);
  return 0;
}

}  // namespace
}  // namespace kvattn::fa2::test

// The entry point (gpu/bench_main.cc makes it main; the GPU bundle calls it by name).
int kvattn_fa2_gpu_bench_main(int argc, char** argv) {
  bool quick = false, fa3 = false;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    fa3 = fa3 || (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc &&
                  std::strcmp(argv[i + 1], "fa3") == 0);
  }
  return fa3 ? kvattn::fa2::test::bench_fa3(quick) : kvattn::fa2::test::bench_main(quick);
}
