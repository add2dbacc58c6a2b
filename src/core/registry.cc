#include "core/backend.h"

namespace kvattn {

const std::vector<const Backend*>& all_backends() {
  static const std::vector<const Backend*> backends = {
      &reference_backend(), &cpu_backend(), &fa2_backend(), &fa3_backend()};
  return backends;
}

const Backend* find_backend(std::string_view name) {
  for (const Backend* b : all_backends()) {
    if (b->name() == name) return b;
  }
  return nullptr;
}

}  // namespace kvattn
