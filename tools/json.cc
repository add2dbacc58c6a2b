#include "tools/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/status_macros.h"

namespace kvattn::json {

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : members_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kNumber;
  v.number_ = d;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kNumber;
  v.integer_ = true;
  v.int_ = i;
  v.number_ = static_cast<double>(i);
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::move(s);
  return v;
}
Value Value::array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kArray;
  v.items_ = std::move(items);
  return v;
}
Value Value::object(std::vector<std::pair<std::string, Value>> members) {
  Value v;
  v.kind_ = Kind::kObject;
  v.members_ = std::move(members);
  return v;
}

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Status parse_document(Value* out) {
    KVATTN_RETURN_IF_ERROR(parse_value(out, 0));
    skip_whitespace();
    if (pos_ != text_.size()) return error("unexpected characters after the JSON value");
    return Status::Ok();
  }

 private:
  Status error(std::string_view what) const {
    return make_error(ErrorCode::kParseError, "JSON: ", what, " at byte ", pos_);
  }

  void skip_whitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool consume_literal(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  Status parse_value(Value* out, int depth) {
    if (depth >= kMaxDepth) return error("nesting deeper than 64 levels");
    skip_whitespace();
    if (pos_ >= text_.size()) return error("unexpected end of input");
    char c = text_[pos_];
    if (c == '{') return parse_object(out, depth);
    if (c == '[') return parse_array(out, depth);
    if (c == '"') {
      std::string s;
      KVATTN_RETURN_IF_ERROR(parse_string(&s));
      *out = Value::string(std::move(s));
      return Status::Ok();
    }
    if (consume_literal("true")) {
      *out = Value::boolean(true);
      return Status::Ok();
    }
    if (consume_literal("false")) {
      *out = Value::boolean(false);
      return Status::Ok();
    }
    if (consume_literal("null")) {
      *out = Value::null();
      return Status::Ok();
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(out);
    return error("unexpected character");
  }

  Status parse_object(Value* out, int depth) {
    ++pos_;  // '{'
    std::vector<std::pair<std::string, Value>> members;
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      *out = Value::object(std::move(members));
      return Status::Ok();
    }
    while (true) {
      skip_whitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return error("expected a member name");
      std::string key;
      KVATTN_RETURN_IF_ERROR(parse_string(&key));
      skip_whitespace();
      if (pos_ >= text_.size() || text_[pos_] != ':') return error("expected ':'");
      ++pos_;
      Value v;
      KVATTN_RETURN_IF_ERROR(parse_value(&v, depth + 1));
      members.emplace_back(std::move(key), std::move(v));
      skip_whitespace();
      if (pos_ >= text_.size()) return error("unterminated object");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == '}') {
        ++pos_;
        break;
      }
      return error("expected ',' or '}'");
    }
    *out = Value::object(std::move(members));
    return Status::Ok();
  }

  Status parse_array(Value* out, int depth) {
    ++pos_;  // '['
    std::vector<Value> items;
    skip_whitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      *out = Value::array(std::move(items));
      return Status::Ok();
    }
    while (true) {
      Value v;
      KVATTN_RETURN_IF_ERROR(parse_value(&v, depth + 1));
      items.push_back(std::move(v));
      skip_whitespace();
      if (pos_ >= text_.size()) return error("unterminated array");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == ']') {
        ++pos_;
        break;
      }
      return error("expected ',' or ']'");
    }
    *out = Value::array(std::move(items));
    return Status::Ok();
  }

  Status parse_hex4(uint32_t* out) {
    if (text_.size() - pos_ < 4) return error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return error("bad hex digit in \\u escape");
      }
    }
    *out = v;
    return Status::Ok();
  }

  static void append_utf8(uint32_t cp, std::string* s) {
    if (cp < 0x80) {
      *s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *s += static_cast<char>(0xC0 | (cp >> 6));
      *s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *s += static_cast<char>(0xE0 | (cp >> 12));
      *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *s += static_cast<char>(0xF0 | (cp >> 18));
      *s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  Status parse_string(std::string* out) {
    ++pos_;  // '"'
    std::string s;
    while (true) {
      if (pos_ >= text_.size()) return error("unterminated string");
      char c = text_[pos_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) return error("control character in string");
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos_ >= text_.size()) return error("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"':
          s += '"';
          break;
        case '\\':
          s += '\\';
          break;
        case '/':
          s += '/';
          break;
        case 'b':
          s += '\b';
          break;
        case 'f':
          s += '\f';
          break;
        case 'n':
          s += '\n';
          break;
        case 'r':
          s += '\r';
          break;
        case 't':
          s += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          KVATTN_RETURN_IF_ERROR(parse_hex4(&cp));
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!consume_literal("\\u")) return error("unpaired surrogate in \\u escape");
            uint32_t low = 0;
            KVATTN_RETURN_IF_ERROR(parse_hex4(&low));
            if (low < 0xDC00 || low >= 0xE000) return error("bad low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            return error("unpaired surrogate in \\u escape");
          }
          append_utf8(cp, &s);
          break;
        }
        default:
          return error("unknown escape in string");
      }
    }
    *out = std::move(s);
    return Status::Ok();
  }

  Status parse_number(Value* out) {
    size_t start = pos_;
    bool integral = true;
    if (text_[pos_] == '-') ++pos_;
    auto digits = [&] {
      size_t n = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_, ++n;
      return n;
    };
    size_t int_start = pos_;
    if (digits() == 0) return error("expected digits in number");
    if (text_[int_start] == '0' && pos_ - int_start > 1) return error("leading zero in number");
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (digits() == 0) return error("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) return error("expected digits in exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      int64_t i = 0;
      auto [p, ec] = std::from_chars(first, last, i);
      if (ec == std::errc() && p == last) {
        *out = Value::integer(i);
        return Status::Ok();
      }
    }
    double d = 0;
    auto [p, ec] = std::from_chars(first, last, d);
    if (ec != std::errc() || p != last || !std::isfinite(d)) return error("number out of range");
    *out = Value::number(d);
    return Status::Ok();
  }

  std::string_view text_;
  size_t pos_ = 0;
};

void serialize_into(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kNull:
      *out += "null";
      break;
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      break;
    case Value::Kind::kNumber: {
      char buf[32];
      auto [p, ec] = v.is_integer() ? std::to_chars(buf, buf + sizeof buf, v.as_int())
                                    : std::to_chars(buf, buf + sizeof buf, v.as_double());
      (void)ec;  // 32 bytes hold every int64 and the shortest round-trip double
      out->append(buf, p);
      break;
    }
    case Value::Kind::kString:
      *out += quote(v.as_string());
      break;
    case Value::Kind::kArray: {
      *out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) *out += ',';
        serialize_into(v.items()[i], out);
      }
      *out += ']';
      break;
    }
    case Value::Kind::kObject: {
      *out += '{';
      for (size_t i = 0; i < v.members().size(); ++i) {
        if (i) *out += ',';
        *out += quote(v.members()[i].first);
        *out += ':';
        serialize_into(v.members()[i].second, out);
      }
      *out += '}';
      break;
    }
  }
}

}  // namespace

Status parse(std::string_view text, Value* out) { return Parser(text).parse_document(out); }

std::string quote(std::string_view s) {
  std::string out = "\"";
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
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string serialize(const Value& v) {
  std::string out;
  serialize_into(v, &out);
  return out;
}

}  // namespace kvattn::json
