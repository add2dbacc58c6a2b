// Device scratch for one call: stream-ordered allocation on the legacy default stream, freed in
// stream order when the owner goes out of scope, so a call can return before the GPU finishes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "core/status_macros.h"
#include "kvattn/status.h"

namespace kvattn::cuda {

inline Status cuda_status(const char* what, cudaError_t err) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  return make_error(ErrorCode::kInternal, what, ": ", cudaGetErrorString(err));
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) (void)cudaFreeAsync(ptr_, nullptr);
  }

  Status allocate(std::size_t bytes) {
    if (bytes == 0) return Status::Ok();
    return cuda_status("cudaMallocAsync", cudaMallocAsync(&ptr_, bytes, nullptr));
  }
  // Allocates and copies a host vector; the copy from pageable memory is staged before return.
  template <class T>
  Status upload(const std::vector<T>& host) {
    KVATTN_RETURN_IF_ERROR(allocate(host.size() * sizeof(T)));
    if (host.empty()) return Status::Ok();
    return cuda_status("cudaMemcpyAsync",
                       cudaMemcpyAsync(ptr_, host.data(), host.size() * sizeof(T),
                                       cudaMemcpyHostToDevice, nullptr));
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

}  // namespace kvattn::cuda
