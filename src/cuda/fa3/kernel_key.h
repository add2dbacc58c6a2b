// The key of fa3's kernel table: the CUDA backends' common key (cuda/common/kernel_key.h: q dtype,
// kv dtype, head dims); what else a problem asks (mask, LSE, layout, o dtype) is a run-time
// parameter, and what the built kernels do not cover yet is said by Fa3Backend::kernel_built.
#pragma once

#include "cuda/common/kernel_key.h"

namespace kvattn::fa3 {

using cuda::kernel_key;
using cuda::kernel_key_string;
using cuda::KernelKey;

}  // namespace kvattn::fa3
