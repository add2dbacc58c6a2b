#include "kvattn/status.h"

namespace kvattn {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kInvalidShape: return "invalid_shape";
    case ErrorCode::kInvalidDType: return "invalid_dtype";
    case ErrorCode::kInvalidPageTable: return "invalid_page_table";
    case ErrorCode::kOutOfBounds: return "out_of_bounds";
    case ErrorCode::kAliasing: return "aliasing";
    case ErrorCode::kInvalidScale: return "invalid_scale";
    case ErrorCode::kOverflow: return "overflow";
    case ErrorCode::kNotSupported: return "not_supported";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kParseError: return "parse_error";
    case ErrorCode::kIoError: return "io_error";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string s(error_code_name(code_));
  s += ": ";
  s += message_;
  return s;
}

}  // namespace kvattn
