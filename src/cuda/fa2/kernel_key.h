// The key of fa2's kernel table: the CUDA backends' common key (cuda/common/kernel_key.h).
#pragma once

#include "cuda/common/kernel_key.h"

namespace kvattn::fa2 {

using cuda::kernel_key;
using cuda::kernel_key_string;
using cuda::KernelKey;

}  // namespace kvattn::fa2
