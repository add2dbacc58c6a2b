#include "kvattn/version.h"

#define KVATTN_STR2(x) #x
#define KVATTN_STR(x) KVATTN_STR2(x)

namespace kvattn {
const char* version_string() {
  return KVATTN_STR(KVATTN_VERSION_MAJOR) "." KVATTN_STR(KVATTN_VERSION_MINOR) "." KVATTN_STR(
      KVATTN_VERSION_PATCH);
}
}  // namespace kvattn
