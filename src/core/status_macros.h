// Internal helpers for building and propagating Status values.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "kvattn/status.h"

#define KVATTN_RETURN_IF_ERROR(expr)        \
  do {                                      \
    ::kvattn::Status _kvattn_status = (expr); \
    if (!_kvattn_status.ok()) return _kvattn_status; \
  } while (0)

namespace kvattn {

// Concatenates its arguments with operator<< into a Status message.
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class... Args>
Status make_error(ErrorCode code, const Args&... args) {
  return Status(code, str_cat(args...));
}

}  // namespace kvattn
