// A small JSON reader and writer helpers for the case files and the command line. The reader is
// fed untrusted bytes (safetensors headers, fuzzing), so it bounds nesting depth and never reads
// past the input; it keeps object members in file order so that duplicate keys can be detected.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvattn/status.h"

namespace kvattn::json {

class Value {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_number() const { return kind_ == Kind::kNumber; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  bool as_bool() const { return bool_; }
  double as_double() const { return number_; }
  // A number written without fraction or exponent that fits int64 (e.g. a shape or an offset).
  bool is_integer() const { return kind_ == Kind::kNumber && integer_; }
  int64_t as_int() const { return int_; }
  const std::string& as_string() const { return string_; }
  const std::vector<Value>& items() const { return items_; }
  const std::vector<std::pair<std::string, Value>>& members() const { return members_; }
  // The first member named `key`, or null.
  const Value* find(std::string_view key) const;

  static Value null() { return Value(); }
  static Value boolean(bool b);
  static Value number(double d);
  static Value integer(int64_t i);
  static Value string(std::string s);
  static Value array(std::vector<Value> items);
  static Value object(std::vector<std::pair<std::string, Value>> members);

 private:
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  bool integer_ = false;
  double number_ = 0;
  int64_t int_ = 0;
  std::string string_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

// Nesting deeper than this is a parse error (the reader recurses once per level).
inline constexpr int kMaxDepth = 64;

// Parses one JSON value; only whitespace may follow it. kParseError says what and where.
Status parse(std::string_view text, Value* out);

// `s` as a JSON string literal, quotes included.
std::string quote(std::string_view s);
// Compact serialization (no whitespace), integers without a fraction.
std::string serialize(const Value& v);

}  // namespace kvattn::json
