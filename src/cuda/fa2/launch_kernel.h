// Launching a __global__ function through fa2's RuntimeCalls (cudaLaunchKernel), so that every
// launch is on an explicit stream and a test can record it.
#pragma once

#include <type_traits>

#include "cuda/fa2/runtime_calls.h"

namespace kvattn::fa2 {

template <class... Params>
Status launch_kernel(const char* what, void (*kernel)(Params...), Dim3 grid, Dim3 block,
                     std::size_t shared_bytes, void* stream,
                     std::type_identity_t<std::remove_const_t<Params>>... args) {
  void* arg_ptrs[] = {static_cast<void*>(&args)..., nullptr};
  return runtime_status(what, runtime().launch(reinterpret_cast<const void*>(kernel), grid, block,
                                               arg_ptrs, shared_bytes, stream));
}

}  // namespace kvattn::fa2
