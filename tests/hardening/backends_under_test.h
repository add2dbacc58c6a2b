// The backend names the hardening tests drive through the public API on this machine's CPU:
// every registered backend that is available on Device::cpu(), plus "auto". Backends that are
// not available are named once on stderr with the reason, never silently dropped.
#pragma once

#include <cstdint>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "core/backend.h"
#include "kvattn/device.h"
#include "kvattn/selection.h"

namespace kvattn::hardening {

inline std::vector<std::string> backends_under_test() {
  static std::set<std::string> reported;
  std::vector<std::string> names;
  for (const std::string& name : backend_names()) {
    const Backend* b = find_backend(name);
    Status avail = b ? b->available(Device::cpu()) : Status(ErrorCode::kInternal, "unregistered");
    if (avail.ok()) {
      names.push_back(name);
    } else if (reported.insert(name).second) {
      std::cerr << "[hardening] skipping backend " << name << ": " << avail.message() << '\n';
    }
  }
  names.push_back("auto");
  return names;
}

// Whether every element of `v` is still `value` (outputs of a refused call stay untouched).
template <class T>
bool all_equal(const std::vector<T>& v, T value) {
  for (const T& x : v) {
    if (!(x == value)) return false;
  }
  return true;
}

}  // namespace kvattn::hardening
