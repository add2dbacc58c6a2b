// What fa2's plan() leaves for run() (Plan::backend_state): the schedule, the page table it was
// made with, and the persistent device workspace holding both plus the split-KV partial states.
// Made only in CUDA builds (launch.cu); run() turns it into kernel launches and nothing else.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/fa2/runtime_calls.h"
#include "cuda/fa2/schedule.h"

namespace kvattn::fa2 {

struct PlanState {
  PlanState() = default;
  PlanState(const PlanState&) = delete;
  PlanState& operator=(const PlanState&) = delete;
  ~PlanState() {
    if (workspace != nullptr) (void)calls->free_device(workspace);
  }

  Schedule schedule;
  // The page ids the device copy holds: run() checks that it is given the same ones.
  std::vector<int32_t> kv_indices;
  WorkspaceLayout layout;
  int device = 0;
  RuntimeCalls* calls = nullptr;  // what allocated the workspace (and frees it)
  void* workspace = nullptr;      // layout.total_bytes of device memory on `device`

  template <class T>
  T* at(std::size_t offset) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(workspace) + offset);
  }
};

}  // namespace kvattn::fa2
