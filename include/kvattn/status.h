// Typed errors. Every public entry point returns a Status; nothing throws across the API.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace kvattn {

// The kind of an error. Tests assert on the kind, messages are for humans.
enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // a value that breaks a rule not covered by a finer kind below
  kInvalidShape,     // rank, dimension or head-count mismatch, head dim 0, H_qo % H_kv != 0
  kInvalidDType,     // a dtype the argument does not accept
  kInvalidPageTable, // indptr / indices / last_page_len break the CSR page-table rules
  kOutOfBounds,      // strides or offsets that leave the given buffer
  kAliasing,         // an output overlaps an input
  kInvalidScale,     // a scale that is NaN, infinite, zero or negative
  kOverflow,         // sizes whose offsets do not fit the index type
  kNotSupported,     // the chosen backend cannot implement the problem (capability)
  kUnavailable,      // the backend is not built, or the device is not present
  kParseError,       // malformed case file / command-line value
  kIoError,          // file system errors
  kInternal,         // a bug in kvattn
};

std::string_view error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<kind>: <message>", or "ok".
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

}  // namespace kvattn
