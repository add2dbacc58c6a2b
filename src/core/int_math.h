// Integer rounding used for tiles, chunks and workspace layouts, host and device, named once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/hd.h"

namespace kvattn {

// ceil(a / b) for a >= 0, b > 0.
KVATTN_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// n rounded up to a multiple of `multiple` (> 0).
KVATTN_HD constexpr std::size_t align_up(std::size_t n, std::size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace kvattn
