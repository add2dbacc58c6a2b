// Test support for the GPU tests: copies of host tensors in CUDA device memory, and a RunBackend
// that runs fa2 (or fa3) on the device copies of a case's tensors and copies the outputs back, so
// the host-side comparison with the reference (testing/tolerance.h) works unchanged.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/device.h"
#include "testing/tolerance.h"

namespace kvattn::fa2::test {

struct KeyShard {
  int index = 0;
  int count = 1;
};

// The first CUDA device of SM80 or newer, or nullopt with why in `why`.
std::optional<Device> gpu_or_reason(std::string* why);
// The first CUDA device with min_sm <= sm <= max_sm (fa3: exactly 90), or nullopt with why.
std::optional<Device> gpu_or_reason(std::string* why, int min_sm, int max_sm);

// Device copies of host views; the copies live as long as the mirror.
class DeviceMirror {
 public:
  DeviceMirror() = default;
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;
  ~DeviceMirror();

  // A device view with the same dtype, shape and strides over a copy of the view's buffer.
  // Empty views stay empty.
  TensorView to_device(const TensorView& host);
  // Copies a device view made by to_device back into the host view it mirrors.
  void to_host(const TensorView& device, const TensorView& host) const;

 private:
  std::vector<void*> buffers_;
};

// Data tensors to the device, index tensors left on the host (fa2's convention).
AttentionArgs mirror_args(const Problem& problem, const AttentionArgs& host, DeviceMirror* m);

// Runs fa2 on `device` through the public API (plan + run), synchronizes, copies out and lse
// back. kv_chunk_size as PlanOptions::kv_chunk_size (0: fa2 decides).
testing::RunBackend run_fa2(const Device& device, int64_t kv_chunk_size = 0);
// fa2 planned on a non-blocking stream of its own, its run captured in a CUDA graph on that
// stream and the graph launched twice (issue 13: run issues only launches on the caller's stream).
testing::RunBackend run_fa2_graph(const Device& device, int64_t kv_chunk_size = 0);
// The same for any backend by name (fa3's tests).
testing::RunBackend run_backend(std::string backend, const Device& device,
                                int64_t kv_chunk_size = 0);

// "[ case     ] WHAT: N ms with the reference" on stderr for a GPU test's case begun at t0 (the
// case's time, the fp64 reference's included: most of a GPU step's time is that reference).
void log_case_time(const std::string& what, std::chrono::steady_clock::time_point t0);

// The share of a kernel-key list a GPU test process runs: all of it, or with
// KVATTN_GPU_KEY_SHARD=i/n (0 <= i < n) the keys at positions i, i + n, ... so that a --full
// bundle's keys split over processes (`run.sh`'s step limits and a lease's minutes). A malformed
// value ends the process with a message naming it (exit 2).
KeyShard key_shard_from_env();

template <class Key>
std::vector<Key> key_shard(const std::vector<Key>& keys) {
  const KeyShard s = key_shard_from_env();
  std::vector<Key> mine;
  for (size_t k = 0; k < keys.size(); ++k) {
    if (int(k % size_t(s.count)) == s.index) mine.push_back(keys[k]);
  }
  return mine;
}

}  // namespace kvattn::fa2::test
