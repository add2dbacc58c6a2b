#pragma once

#define KVATTN_VERSION_MAJOR 0
#define KVATTN_VERSION_MINOR 1
#define KVATTN_VERSION_PATCH 0

namespace kvattn {
const char* version_string();
}  // namespace kvattn
