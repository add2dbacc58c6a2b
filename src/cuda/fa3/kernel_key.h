// The key of fa3's kernel table: fa2's (q dtype, kv dtype, head dims), the same concept; what
// else a problem asks (mask, LSE, layout, o dtype) is a run-time parameter, and what the built
// kernels do not cover yet is said by Fa3Backend::kernel_built.
#pragma once

#include "cuda/fa2/kernel_key.h"

namespace kvattn::fa3 {

using fa2::kernel_key;
using fa2::kernel_key_string;
using fa2::KernelKey;

}  // namespace kvattn::fa3
