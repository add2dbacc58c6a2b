// fa3's GPU benchmarks (DESIGN.md §6; issue 10's goals on an H200): causal prefill at 8k tokens in
// TFLOP/s, bf16 and e4m3 (FP8 q over an FP8 cache), d128, GQA 32/8, over ragged (TMA) and paged
// (cp.async) K/V; batch decode in GB/s (bytes of Q, K, V and O moved) next to the device-to-device
// copy bandwidth measured in the same run. Only what this build compiled is run. Usage:
// kvattn_fa3_gpu_bench [--quick]. Without an SM90 device, or without fa3's kernels, it says why
// and exits 0 (nothing measured).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/bench_timing.h"
#include "cuda/fa3/kernel_keys.h"
#include "cuda/gpu/device_mirror.h"
#include "kvattn/kvattn.h"

namespace kvattn::fa3::test {
namespace {

using cuda::test::copy_bandwidth_gbs;
using cuda::test::device_alloc;
using cuda::test::on_device;
using cuda::test::time_ms;

constexpr int kQoHeads = 32, kKvHeads = 8, kDim = 128;

bool built(DType q, DType kv) {
  for (int i = 0; i < kBuiltKernelCount; ++i) {
    if (kBuiltKernelKeysStorage[i] == KernelKey{q, kv, kDim, kDim}) return true;
  }
  return false;
}

// A batch of `batch` requests of qo_len queries over kv_len keys: paged (page 16) or ragged.
struct Batch {
  Problem problem;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, last;
  std::vector<void*> buffers;
  AttentionArgs args;
  double bytes = 0, flops = 0;
  ~Batch() {
    for (void* p : buffers) (void)cudaFree(p);
  }
};

void make_batch(Batch* b, Op op, int batch, int64_t qo_len, int64_t kv_len, DType dtype) {
  Problem& p = b->problem;
  p.op = op;
  p.batch_size = batch;
  p.num_qo_heads = kQoHeads;
  p.num_kv_heads = kKvHeads;
  p.head_dim_qk = p.head_dim_vo = kDim;
  p.page_size = 16;
  p.q_dtype = p.kv_dtype = dtype;
  p.o_dtype = DType::kBF16;
  if (op != Op::kBatchDecode) p.mask_mode = MaskMode::kCausal;
  const bool paged = is_paged(op);
  const int64_t pages_per = paged ? (kv_len + p.page_size - 1) / p.page_size : 0;
  const int64_t slots = paged ? pages_per * batch * p.page_size : kv_len * batch;
  b->qo_indptr.push_back(0);
  b->kv_indptr.push_back(0);
  for (int i = 0; i < batch; ++i) {
    b->qo_indptr.push_back(int32_t((i + 1) * qo_len));
    b->kv_indptr.push_back(int32_t((i + 1) * (paged ? pages_per : kv_len)));
    b->last.push_back(int32_t(kv_len - (pages_per - 1) * p.page_size));
  }
  for (int64_t i = 0; i < pages_per * batch; ++i) b->kv_indices.push_back(int32_t(i));
  const int64_t rows = int64_t(batch) * (op == Op::kBatchDecode ? 1 : qo_len);
  const size_t es = dtype_size(dtype);
  const size_t kv_bytes = size_t(slots) * kKvHeads * kDim * es;
  const size_t q_bytes = size_t(rows) * kQoHeads * kDim * es;
  const size_t o_bytes = size_t(rows) * kQoHeads * kDim * 2;
  const int fill = es == 1 ? 0x30 : 0x3c;  // small finite values in either type
  void* q = device_alloc(q_bytes, fill);
  void* k = device_alloc(kv_bytes, fill);
  void* v = device_alloc(kv_bytes, fill);
  void* o = device_alloc(o_bytes, 0);
  b->buffers = {q, k, v, o};
  AttentionArgs& a = b->args;
  a.q = on_device(q, dtype, {rows, kQoHeads, kDim});
  a.out = on_device(o, DType::kBF16, {rows, kQoHeads, kDim});
  if (paged) {
    const int64_t pages = pages_per * batch;
    a.paged_k_cache = on_device(k, dtype, {pages, 16, kKvHeads, kDim});
    a.paged_v_cache = on_device(v, dtype, {pages, 16, kKvHeads, kDim});
    a.kv_indices = TensorView::contiguous(b->kv_indices.data(), DType::kI32, {pages});
    a.kv_last_page_len = TensorView::contiguous(b->last.data(), DType::kI32, {batch});
  } else {
    a.k = on_device(k, dtype, {slots, kKvHeads, kDim});
    a.v = on_device(v, dtype, {slots, kKvHeads, kDim});
  }
  a.kv_indptr = TensorView::contiguous(b->kv_indptr.data(), DType::kI32, {batch + 1});
  if (op != Op::kBatchDecode) {
    a.qo_indptr = TensorView::contiguous(b->qo_indptr.data(), DType::kI32, {batch + 1});
  }
  // Bytes a decode must move: the keys and values it reads (not the page padding), Q and O.
  b->bytes = 2.0 * double(batch) * double(kv_len) * kKvHeads * kDim * double(es) + double(q_bytes) +
             double(o_bytes);
  const double lq = double(op == Op::kBatchDecode ? 1 : qo_len), lkv = double(kv_len);
  const double pairs = p.mask_mode == MaskMode::kCausal ? (2 * lkv - lq) * lq : 2 * lq * lkv;
  b->flops = double(batch) * pairs * kQoHeads * (kDim + kDim);
}

double run_ms(Batch& b, const Device& device, int iters) {
  PlanOptions options;
  options.backend = "fa3";
  options.device = device;
  Plan plan;
  Status st = kvattn::plan(b.problem, b.args, options, &plan);
  if (!st.ok()) {
    std::fprintf(stderr, "plan: %s\n", st.message().c_str());
    std::exit(1);
  }
  return time_ms(
      [&] {
        Status s = kvattn::run(plan, b.args);
        if (!s.ok()) {
          std::fprintf(stderr, "run: %s\n", s.message().c_str());
          std::exit(1);
        }
      },
      iters);
}

int bench(bool quick) {
  std::string why;
  std::optional<Device> device = fa2::test::gpu_or_reason(&why, 90, 90);
  if (kBuiltKernelCount == 0) why = "fa3's kernels are not built";
  if (kBuiltKernelCount == 0 || !device) {
    std::printf("fa3 GPU benchmarks skipped: %s\n", why.c_str());
    return 0;
  }
  const double copy = copy_bandwidth_gbs();
  std::printf("device %s, backend fa3, copy bandwidth (D2D, read+write) %.0f GB/s\n",
              device->to_string().c_str(), copy);
  for (DType dt : {DType::kBF16, DType::kE4M3}) {
    if (!built(dt, dt)) continue;
    for (Op op : {Op::kBatchPrefillRagged, Op::kBatchPrefillPaged}) {
      for (auto [batch, len] : {std::pair{1, int64_t(8192)}, std::pair{4, int64_t(4096)}}) {
        Batch b;
        make_batch(&b, op, batch, len, len, dt);
        const double ms = run_ms(b, *device, quick ? 2 : 5);
        std::printf("prefill causal q=kv %-4s %-22s B=%d len=%-6lld %8.3f ms %7.1f TFLOP/s\n",
                    std::string(dtype_name(dt)).c_str(), std::string(op_name(op)).c_str(), batch,
                    (long long)len, ms, b.flops / (ms * 1e-3) / 1e12);
      }
    }
    for (auto [batch, len] : {std::pair{64, int64_t(4096)}, std::pair{8, int64_t(32768)},
                              std::pair{1, int64_t(131072)}}) {
      Batch b;
      make_batch(&b, Op::kBatchDecode, batch, 1, len, dt);
      const double ms = run_ms(b, *device, quick ? 5 : 20);
      const double gbs = b.bytes / (ms * 1e-3) / 1e9;
      std::printf("decode q=kv %-4s B=%-3d kv_len=%-6lld %8.3f ms %7.0f GB/s (%.0f%% of copy)\n",
                  std::string(dtype_name(dt)).c_str(), batch, (long long)len, ms, gbs,
                  100.0 * gbs / copy);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvattn::fa3::test

// The entry point (gpu/bench_main.cc makes it main; the GPU bundle calls it by name).
int kvattn_fa3_gpu_bench_main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::strcmp(argv[i], "--quick") == 0;
  return kvattn::fa3::test::bench(quick);
}
