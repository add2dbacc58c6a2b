// Selection: per-device, per-operation priority lists; can_implement decides (DESIGN.md §3).
#include "kvattn/selection.h"

#include <algorithm>
#include <sstream>

#include "core/backend.h"
#include "core/cpu_features.h"
#include "core/cuda_query.h"
#include "core/status_macros.h"
#include "core/validate.h"

namespace kvattn {
namespace {

// The priority list for a device and operation; the only place that orders backends.
std::vector<std::string_view> priority_list(const Problem& problem, const Device& device) {
  if (device.is_cpu()) return {"cpu", "reference"};
  if (device.sm == 90) {
    // FA3 is slower than FA2 on decode shapes (one query row per request).
    if (is_decode(problem.op)) return {"fa2", "fa3"};
    return {"fa3", "fa2"};
  }
  if (device.sm >= 80) return {"fa2"};
  return {};
}

// Backends in explain order: the priority list first, then every other registered one.
std::vector<const Backend*> explain_order(const Problem& problem, const Device& device) {
  std::vector<const Backend*> order;
  for (std::string_view name : priority_list(problem, device)) {
    if (const Backend* b = find_backend(name)) order.push_back(b);
  }
  for (const Backend* b : all_backends()) {
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  }
  return order;
}

}  // namespace

std::vector<std::string_view> aux_priority_list(const Device& device) {
  if (device.is_cpu()) return {"cpu", "reference"};
  if (device.sm >= 80) return {"fa2"};
  return {};
}

namespace {

bool in_priority_list(const Problem& problem, const Device& device, std::string_view name) {
  auto list = priority_list(problem, device);
  return std::find(list.begin(), list.end(), name) != list.end();
}

Status usable(const Backend& b, const Problem& problem, const Device& device) {
  KVATTN_RETURN_IF_ERROR(b.can_implement(problem, device));
  KVATTN_RETURN_IF_ERROR(b.available(device));
  return b.kernel_built(problem, device);
}

std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Backend* b : all_backends()) names.emplace_back(b->name());
  return names;
}

Explanation explain(const Problem& problem, const Device& device) {
  Explanation e;
  e.device = device;
  Status valid = validate_problem(problem);
  for (const Backend* b : explain_order(problem, device)) {
    Verdict v;
    v.backend = std::string(b->name());
    Status cap = valid.ok() ? b->can_implement(problem, device) : valid;
    v.supported = cap.ok();
    v.reason = cap.ok() ? "" : cap.message();
    Status avail = b->available(device);
    // A kernel this build lacks is said even where the device is absent (a described one), as
    // long as CUDA support is built at all (else "not built" says it).
    if (cap.ok() && (avail.ok() || !device.is_cuda() || detail::cuda_support_built())) {
      Status built = b->kernel_built(problem, device);
      if (avail.ok()) {
        avail = built;
      } else if (!built.ok() && built.message() != avail.message()) {
        avail = Status(avail.code(), avail.message() + "; " + built.message());
      }
    }
    v.available = avail.ok();
    v.availability = avail.ok() ? "" : avail.message();
    if (cap.ok()) {
      Status k = b->planned_kernel(problem, device, &v.cpu_kernel, &v.cpu_kernel_taller,
                                   &v.cpu_kernel_one_token);
      if (!k.ok()) v.cpu_kernel_error = k.message();
    }
    if (!e.selected && v.supported && in_priority_list(problem, device, v.backend) &&
        (device.described || v.available)) {
      e.selected = v.backend;
    }
    e.verdicts.push_back(std::move(v));
  }
  return e;
}

std::string Explanation::to_json() const {
  std::ostringstream os;
  os << "{\"device\": \"" << json_escape(device.to_string()) << "\", \"selected\": ";
  if (selected) {
    os << '"' << json_escape(*selected) << '"';
  } else {
    os << "null";
  }
  os << ", \"verdicts\": [";
  for (std::size_t i = 0; i < verdicts.size(); ++i) {
    const Verdict& v = verdicts[i];
    os << (i ? ", " : "") << "{\"backend\": \"" << json_escape(v.backend)
       << "\", \"supported\": " << (v.supported ? "true" : "false") << ", \"reason\": \""
       << json_escape(v.reason) << "\", \"available\": " << (v.available ? "true" : "false")
       << ", \"availability\": \"" << json_escape(v.availability) << '"';
    if (v.backend == "cpu") {
      os << ", \"cpu_kernel\": ";
      if (v.cpu_kernel.empty()) {
        os << "null, \"cpu_kernel_error\": \"" << json_escape(v.cpu_kernel_error) << '"';
      } else {
        os << '"' << json_escape(v.cpu_kernel) << '"';
      }
      os << ", \"cpu_kernel_taller\": [";
      for (std::size_t t = 0; t < v.cpu_kernel_taller.size(); ++t) {
        os << (t ? ", " : "") << '"' << json_escape(v.cpu_kernel_taller[t]) << '"';
      }
      os << "], \"cpu_kernel_one_token\": ";
      if (v.cpu_kernel_one_token.empty()) {
        os << "null";
      } else {
        os << '"' << json_escape(v.cpu_kernel_one_token) << '"';
      }
    }
    os << '}';
  }
  os << "]}";
  return os.str();
}

std::string Explanation::to_text() const {
  std::ostringstream os;
  os << "device: " << device.to_string() << (device.described ? " (described)" : "") << '\n';
  os << "selected: " << (selected ? *selected : std::string("none")) << '\n';
  for (const Verdict& v : verdicts) {
    os << "  " << v.backend << ": " << (v.supported ? "supported" : "not supported");
    if (!v.supported) os << " (" << v.reason << ")";
    os << "; " << (v.available ? "available" : "not available");
    if (!v.available) os << " (" << v.availability << ")";
    if (!v.cpu_kernel.empty()) os << "; kernel " << v.cpu_kernel;
    for (std::size_t t = 0; t < v.cpu_kernel_taller.size(); ++t) {
      os << (t ? ", " : " (or, where the requests' lengths allow, ") << v.cpu_kernel_taller[t];
    }
    if (!v.cpu_kernel_taller.empty()) os << ')';
    if (!v.cpu_kernel_one_token.empty()) {
      os << "; one query token a request: " << v.cpu_kernel_one_token;
    }
    if (!v.cpu_kernel_error.empty()) os << "; no kernel (" << v.cpu_kernel_error << ")";
    os << '\n';
  }
  return os.str();
}

Status check_backend_name(std::string_view requested) {
  if (requested.empty() || requested == "auto" || find_backend(requested)) return Status::Ok();
  std::string names;
  for (const std::string& n : backend_names()) names += " " + n;
  return make_error(ErrorCode::kInvalidArgument, "backend '", requested,
                    "' is unknown (expected auto or one of:", names, ")");
}

Status select_backend(const Problem& problem, const Device& device, const std::string& requested,
                      std::string* selected) {
  KVATTN_RETURN_IF_ERROR(validate_problem(problem));
  if (requested.empty() || requested == "auto") {
    std::ostringstream reasons;
    // kUnavailable when some backend could run the problem but is not here; else kNotSupported.
    ErrorCode code = ErrorCode::kNotSupported;
    auto list = priority_list(problem, device);
    for (std::string_view name : list) {
      const Backend* b = find_backend(name);
      if (!b) continue;
      Status s = usable(*b, problem, device);
      if (s.ok()) {
        *selected = std::string(name);
        return Status::Ok();
      }
      if (s.code() == ErrorCode::kUnavailable) code = ErrorCode::kUnavailable;
      reasons << "\n  " << name << ": " << s.message();
    }
    if (list.empty()) {
      return make_error(ErrorCode::kNotSupported, "no backend runs on device ", device.to_string(),
                        " (CUDA backends need SM80 or newer)");
    }
    // Backends outside the priority list are named too, so the message lists every reason.
    for (const Backend* b : all_backends()) {
      if (in_priority_list(problem, device, b->name())) continue;
      Status s = b->can_implement(problem, device);
      reasons << "\n  " << b->name() << ": "
              << (s.ok() ? "not in the priority list for " + device.to_string() : s.message());
    }
    return make_error(code, "no backend can run this problem on ", device.to_string(), ":",
                      reasons.str());
  }
  KVATTN_RETURN_IF_ERROR(check_backend_name(requested));
  const Backend* b = find_backend(requested);
  Status cap = b->can_implement(problem, device);
  if (!cap.ok()) {
    Explanation e = explain(problem, device);
    std::string alternative = e.selected
                                  ? "backend " + *e.selected + " would run it"
                                  : std::string("no backend can run it on ") + device.to_string();
    return make_error(ErrorCode::kNotSupported, "backend ", requested,
                      " cannot run this problem: ", cap.message(), "; ", alternative);
  }
  Status avail = b->available(device);
  if (!avail.ok()) {
    return make_error(ErrorCode::kUnavailable, "backend ", requested,
                      " is not available: ", avail.message());
  }
  Status built = b->kernel_built(problem, device);
  if (!built.ok()) {
    return make_error(ErrorCode::kUnavailable, "backend ", requested,
                      " has no kernel for this problem in this build: ", built.message());
  }
  *selected = requested;
  return Status::Ok();
}

}  // namespace kvattn
