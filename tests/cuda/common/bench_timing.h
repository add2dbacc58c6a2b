// The GPU benchmarks' timing harness (fa2's and fa3's, tests/cuda/gpu/*_bench.cc): device buffers,
// device tensor views, CUDA-event timing and the device-to-device copy bandwidth every figure is
// put next to. Figures are medians of per-launch event times (DESIGN.md: medians, same-run
// rooflines).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <vector>

#include "kvattn/attention.h"

namespace kvattn::cuda::test {

#define KVATTN_BENCH_CHECK(expr)                                         \
  do {                                                                   \
    cudaError_t err_ = (expr);                                           \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

// `bytes` of device memory, every byte set to `fill`; exits on failure.
inline void* device_alloc(size_t bytes, int fill) {
  void* p = nullptr;
  KVATTN_BENCH_CHECK(cudaMalloc(&p, bytes));
  KVATTN_BENCH_CHECK(cudaMemset(p, fill, bytes));
  return p;
}

// A contiguous view of device memory.
inline TensorView on_device(void* p, DType dtype, std::initializer_list<int64_t> shape) {
  TensorView t = TensorView::contiguous(p, dtype, shape);
  t.memory = MemoryKind::kCuda;
  return t;
}

// One warm-up call, then the median over `iters` calls of the time between two events around
// each (on the default stream), in ms.
template <class F>
double time_ms(F&& f, int iters) {
  f();
  KVATTN_BENCH_CHECK(cudaDeviceSynchronize());
  iters = std::max(iters, 1);
  std::vector<cudaEvent_t> events(size_t(iters) + 1);
  for (cudaEvent_t& e : events) KVATTN_BENCH_CHECK(cudaEventCreate(&e));
  KVATTN_BENCH_CHECK(cudaEventRecord(events[0]));
  for (int i = 0; i < iters; ++i) {
    f();
    KVATTN_BENCH_CHECK(cudaEventRecord(events[size_t(i) + 1]));
  }
  KVATTN_BENCH_CHECK(cudaEventSynchronize(events.back()));
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    const size_t k = size_t(i);
    KVATTN_BENCH_CHECK(cudaEventElapsedTime(&ms[k], events[k], events[k + 1]));
  }
  for (cudaEvent_t& e : events) KVATTN_BENCH_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (double(ms[n / 2 - 1]) + double(ms[n / 2]));
}

// The device-to-device copy bandwidth (1 GiB, read + write), GB/s: the decode figures' roofline.
inline double copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  void* src = device_alloc(bytes, 1);
  void* dst = device_alloc(bytes, 0);
  const double ms = time_ms(
      [&] { KVATTN_BENCH_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  KVATTN_BENCH_CHECK(cudaFree(src));
  KVATTN_BENCH_CHECK(cudaFree(dst));
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

}  // namespace kvattn::cuda::test
