// The CUDA runtime behind fa2's RuntimeCalls (runtime_calls.h).
#include "cuda/fa2/runtime_calls.h"

#include <cuda_runtime_api.h>

#include <atomic>

namespace kvattn::fa2 {
namespace {

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

class CudaRuntime final : public RuntimeCalls {
 public:
  int get_device(int* device) override { return cudaGetDevice(device); }
  int set_device(int device) override { return cudaSetDevice(device); }
  int sm_count(int device, int* count) override {
    return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  }
  int malloc_device(void** ptr, std::size_t bytes) override { return cudaMalloc(ptr, bytes); }
  int free_device(void* ptr) override { return cudaFree(ptr); }
  int malloc_pinned(void** ptr, std::size_t bytes) override { return cudaMallocHost(ptr, bytes); }
  int free_pinned(void* ptr) override { return cudaFreeHost(ptr); }
  int malloc_async(void** ptr, std::size_t bytes, void* stream) override {
    return cudaMallocAsync(ptr, bytes, as_stream(stream));
  }
  int free_async(void* ptr, void* stream) override { return cudaFreeAsync(ptr, as_stream(stream)); }
  int copy_to_device_async(void* dst, const void* src, std::size_t bytes, void* stream) override {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream));
  }
  int stream_synchronize(void* stream) override { return cudaStreamSynchronize(as_stream(stream)); }
  int set_max_dynamic_shared_memory(const void* kernel, int bytes) override {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  }
  int launch(const void* kernel, Dim3 grid, Dim3 block, void** args, std::size_t shared_bytes,
             void* stream) override {
    return cudaLaunchKernel(kernel, dim3(grid.x, grid.y, grid.z), dim3(block.x, block.y, block.z),
                            args, shared_bytes, as_stream(stream));
  }
  const char* error_string(int error) override {
    return cudaGetErrorString(static_cast<cudaError_t>(error));
  }
};

CudaRuntime& cuda_runtime() {
  static CudaRuntime r;
  return r;
}

std::atomic<RuntimeCalls*> g_substitute{nullptr};

}  // namespace

RuntimeCalls& runtime() {
  RuntimeCalls* s = g_substitute.load(std::memory_order_acquire);
  return s ? *s : cuda_runtime();
}

RuntimeCalls* substitute_runtime(RuntimeCalls* calls) {
  return g_substitute.exchange(calls, std::memory_order_acq_rel);
}

Status runtime_status(const char* what, int error) {
  if (error == 0) return Status::Ok();
  // A non-sticky error stays in the runtime's last-error slot; clear it so that the engine's next
  // CUDA call does not inherit it (only from the real runtime: a substitute has no such slot).
  if (&runtime() == static_cast<RuntimeCalls*>(&cuda_runtime())) (void)cudaGetLastError();
  return make_error(ErrorCode::kInternal, what, ": ", runtime().error_string(error));
}

}  // namespace kvattn::fa2
