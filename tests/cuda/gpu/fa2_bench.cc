// fa2's GPU benchmarks (DESIGN.md §5): batch decode of the founding case (bf16 q over an e4m3
// paged cache, d128, GQA 32/8) in GB/s next to the device-to-device copy bandwidth measured in
// the same run, and causal batch prefill in TFLOP/s. Usage: kvattn_fa2_gpu_bench [--quick]
// [--backend fa3]: with fa3 (SM90 only), causal bf16 d128 prefill alone (fa3 has no decode
// kernel, and bf16 q over an FP8 cache is not fa3's), up to 8k tokens. Without a suitable CUDA
// device it says why and exits 0 (nothing measured).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_query.h"
#include "cuda/gpu/device_mirror.h"
#include "kvattn/kvattn.h"

namespace kvattn::fa2::test {
namespace {

#define BENCH_CHECK(expr)                                                \
  do {                                                                   \
    cudaError_t err_ = (expr);                                           \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

void* device_alloc(size_t bytes, int fill) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, bytes));
  BENCH_CHECK(cudaMemset(p, fill, bytes));
  return p;
}

TensorView on_device(void* p, DType dtype, std::initializer_list<int64_t> shape) {
  TensorView t = TensorView::contiguous(p, dtype, shape);
  t.memory = MemoryKind::kCuda;
  return t;
}

// Median-free simple timing: warm up, then the mean of `iters` runs between two events.
template <class F>
double time_ms(F&& f, int iters) {
  f();
  BENCH_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  BENCH_CHECK(cudaEventCreate(&a));
  BENCH_CHECK(cudaEventCreate(&b));
  BENCH_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  BENCH_CHECK(cudaEventRecord(b));
  BENCH_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms / iters;
}

double copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  void* src = device_alloc(bytes, 1);
  void* dst = device_alloc(bytes, 0);
  double ms =
      time_ms([&] { BENCH_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  BENCH_CHECK(cudaFree(src));
  BENCH_CHECK(cudaFree(dst));
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;  // read + write
}

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
  for (void* p : b.buffers) BENCH_CHECK(cudaFree(p));
  return ms;
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
  return 0;
}

}  // namespace
}  // namespace kvattn::fa2::test

int main(int argc, char** argv) {
  bool quick = false, fa3 = false;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    fa3 = fa3 || (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc &&
                  std::strcmp(argv[i + 1], "fa3") == 0);
  }
  return fa3 ? kvattn::fa2::test::bench_fa3(quick) : kvattn::fa2::test::bench_main(quick);
}
