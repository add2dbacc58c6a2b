// timed_run_cuda with the CUDA runtime: data tensors to device memory, run, outputs back.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/status_macros.h"
#include "tools/timed_run.h"

namespace kvattn::tools {
namespace {

Status cuda_error(const char* what, cudaError_t err) {
  (void)cudaGetLastError();  // the runtime keeps some errors sticky
  return make_error(ErrorCode::kInternal, what, ": ", cudaGetErrorString(err));
}

// Device allocations freed when the run ends, whatever path it takes.
class DeviceAllocations {
 public:
  DeviceAllocations() = default;
  DeviceAllocations(const DeviceAllocations&) = delete;
  DeviceAllocations& operator=(const DeviceAllocations&) = delete;
  ~DeviceAllocations() {
    for (void* p : pointers_) cudaFree(p);
  }
  Status allocate(size_t bytes, void** out) {
    *out = nullptr;
    // One byte at least, so that an empty tensor still has a distinct, valid address.
    cudaError_t err = cudaMalloc(out, std::max<size_t>(bytes, 1));
    if (err != cudaSuccess) return cuda_error("cudaMalloc", err);
    pointers_.push_back(*out);
    return Status::Ok();
  }

 private:
  std::vector<void*> pointers_;
};

// Moves a host view of contiguous bytes to the device; the view then points there.
Status to_device(TensorView* view, int device_index, DeviceAllocations* allocations) {
  if (view->empty()) return Status::Ok();
  const size_t bytes = static_cast<size_t>(view->buffer_bytes);
  void* device = nullptr;
  KVATTN_RETURN_IF_ERROR(allocations->allocate(bytes, &device));
  if (bytes > 0) {
    cudaError_t err = cudaMemcpy(device, view->data, bytes, cudaMemcpyHostToDevice);
    if (err != cudaSuccess) return cuda_error("cudaMemcpy to the device", err);
  }
  view->data = device;
  view->memory = MemoryKind::kCuda;
  view->device_index = device_index;
  return Status::Ok();
}

Status synchronize() {
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return cuda_error("the attention kernels failed", err);
  return Status::Ok();
}

}  // namespace

Status timed_run_cuda(const io::OwnedCase& c, const PlanOptions& options, int repeat,
                      io::OutputBuffers* outputs, TimedRun* out) {
  const Problem& p = c.problem;
  const int index = options.device.index;
  cudaError_t err = cudaSetDevice(index);
  if (err != cudaSuccess) return cuda_error("cudaSetDevice", err);
  // Host outputs first (NaN-filled): they give the sizes, and the NaNs go to the device too, so a
  // skipped write shows after the copy back.
  AttentionArgs a = c.args_with_outputs(outputs, p.o_dtype, c.run.return_lse);
  DeviceAllocations allocations;
  // The data tensors move; the index tensors (indptrs, page table) stay on the host.
  for (TensorView* view :
       {&a.q, &a.k, &a.v, &a.paged_k_cache, &a.paged_v_cache, &a.custom_mask, &a.alibi_slopes,
        &a.sinks, &a.k_scale, &a.v_scale, &a.k_scale_cache, &a.v_scale_cache, &a.out, &a.lse}) {
    KVATTN_RETURN_IF_ERROR(to_device(view, index, &allocations));
  }
  KVATTN_RETURN_IF_ERROR(plan(p, a, options, &out->plan));
  KVATTN_RETURN_IF_ERROR(run(out->plan, a));  // warm-up
  KVATTN_RETURN_IF_ERROR(synchronize());
  out->seconds.clear();
  for (int i = 0; i < repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    KVATTN_RETURN_IF_ERROR(run(out->plan, a));
    KVATTN_RETURN_IF_ERROR(synchronize());
    auto stop = std::chrono::steady_clock::now();
    out->seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  std::sort(out->seconds.begin(), out->seconds.end());
  err = cudaMemcpy(outputs->out.data(), a.out.data, outputs->out.size(), cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return cuda_error("cudaMemcpy of out to the host", err);
  if (!outputs->lse.empty()) {
    err = cudaMemcpy(outputs->lse.data(), a.lse.data, outputs->lse.size(), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) return cuda_error("cudaMemcpy of lse to the host", err);
  }
  return Status::Ok();
}

}  // namespace kvattn::tools
