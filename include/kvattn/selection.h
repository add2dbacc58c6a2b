// Which backend runs a problem, and why (DESIGN.md §3).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn {

struct Verdict {
  std::string backend;
  bool supported = false;    // can_implement(problem, device)
  std::string reason;        // why not (empty when supported)
  bool available = false;    // built, and the device is present on this machine
  std::string availability;  // why not available (empty when available)
  // The cpu backend: the kernel-table entry its plan would run (set when supported), or why
  // none can be chosen (an override that does not apply). Empty for the other backends.
  std::string cpu_kernel;
  std::string cpu_kernel_error;
  // The cpu backend's prefill: the kernels of taller query tiles its plan takes in cpu_kernel's
  // place where the requests' lengths allow (enough work items for the threads), shortest first;
  // empty where there are none or KVATTN_CPU_KERNEL decides.
  std::vector<std::string> cpu_kernel_taller;
  // The cpu backend's paged batch prefill: the decode kernel its plan runs where every request
  // has one query token (a decode step sent as a prefill); empty for the other ops, where
  // KVATTN_CPU_KERNEL names a prefill kernel, or where no decode kernel can be chosen.
  std::string cpu_kernel_one_token;
};

struct Explanation {
  Device device;
  std::optional<std::string> selected;  // the first supported backend of the priority list
  std::vector<Verdict> verdicts;        // every registered backend, priority order first
  // {"device":..., "selected":..., "verdicts":[...]}; the cpu verdict carries "cpu_kernel",
  // "cpu_kernel_taller" and "cpu_kernel_one_token".
  std::string to_json() const;
  std::string to_text() const;
};

// Every backend's verdict. For a described device this machine does not have, `selected` is what
// a build with every backend would pick (capability decides), and availability is reported beside.
Explanation explain(const Problem& problem, const Device& device);

// The backend that will run `problem` on `device`: "auto" takes the first of the device's
// priority list that can implement it and is available; an explicit name must be able to, or it
// is an error naming the backend, the rule, the value and the backend that would run it.
Status select_backend(const Problem& problem, const Device& device, const std::string& requested,
                      std::string* selected);

// Registered backend names, in registration order.
std::vector<std::string> backend_names();

// kInvalidArgument naming the registered backends unless `requested` is "auto", empty (auto) or
// one of them: the check select_backend makes first, for callers that take a backend name before
// they have a problem (the Python wrappers' constructors).
Status check_backend_name(std::string_view requested);

}  // namespace kvattn
