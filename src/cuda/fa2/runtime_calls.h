// Every CUDA runtime call fa2's host code makes, behind one small interface: the real one calls
// the CUDA runtime; a test substitutes a recorder and checks what plan and run issue (run: only
// kernel launches, all on the caller's stream) without a GPU. Plain C++ (no CUDA types), so that
// host tests can implement it. Return values are cudaError_t codes (0: success).
#pragma once

#include <cstddef>

#include "core/status_macros.h"
#include "kvattn/status.h"

namespace kvattn::fa2 {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

class RuntimeCalls {
 public:
  virtual ~RuntimeCalls() = default;
  virtual int get_device(int* device) = 0;
  virtual int set_device(int device) = 0;
  virtual int sm_count(int device, int* count) = 0;
  // Plan-time memory: the persistent device workspace and its pinned host staging.
  virtual int malloc_device(void** ptr, std::size_t bytes) = 0;
  virtual int free_device(void* ptr) = 0;
  virtual int malloc_pinned(void** ptr, std::size_t bytes) = 0;
  virtual int free_pinned(void* ptr) = 0;
  // Stream-ordered scratch (the aux operations' per-call index arrays).
  virtual int malloc_async(void** ptr, std::size_t bytes, void* stream) = 0;
  virtual int free_async(void* ptr, void* stream) = 0;
  virtual int copy_to_device_async(void* dst, const void* src, std::size_t bytes, void* stream) = 0;
  virtual int stream_synchronize(void* stream) = 0;
  virtual int set_max_dynamic_shared_memory(const void* kernel, int bytes) = 0;
  // cudaLaunchKernel: `args` points to the kernel's arguments.
  virtual int launch(const void* kernel, Dim3 grid, Dim3 block, void** args,
                     std::size_t shared_bytes, void* stream) = 0;
  virtual const char* error_string(int error) = 0;
};

// The calls fa2 makes now: the CUDA runtime, unless a test substituted its own.
RuntimeCalls& runtime();
// Substitutes `calls` (null: the CUDA runtime again); returns the previous one. For tests; not
// thread-safe against concurrent fa2 calls.
RuntimeCalls* substitute_runtime(RuntimeCalls* calls);

// OK, or kInternal naming the call and the runtime's reason.
Status runtime_status(const char* what, int error);

// Sets the current device for the lifetime of the guard and restores the caller's on exit, so
// that no fa2 call leaves the engine's thread on another device.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (restore_ >= 0 && restore_ != current_) (void)runtime().set_device(restore_);
  }
  Status enter(int device) {
    int previous = -1;
    KVATTN_RETURN_IF_ERROR(runtime_status("cudaGetDevice", runtime().get_device(&previous)));
    restore_ = previous;
    current_ = previous;
    if (device == previous) return Status::Ok();
    KVATTN_RETURN_IF_ERROR(runtime_status("cudaSetDevice", runtime().set_device(device)));
    current_ = device;
    return Status::Ok();
  }

 private:
  int restore_ = -1;
  int current_ = -1;
};

}  // namespace kvattn::fa2
