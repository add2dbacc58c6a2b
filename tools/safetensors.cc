#include "tools/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include "core/status_macros.h"
#include "tools/json.h"

namespace kvattn::io {
namespace {

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::kF32, "F32"},      {DType::kF16, "F16"},      {DType::kBF16, "BF16"},
    {DType::kE4M3, "F8_E4M3"}, {DType::kE5M2, "F8_E5M2"}, {DType::kI32, "I32"},
    {DType::kU8, "U8"},
};

Status parse_error(const std::string& what) {
  return Status(ErrorCode::kParseError, "safetensors: " + what);
}

// Reads a non-negative JSON integer.
bool non_negative_integer(const json::Value& v, int64_t* out) {
  if (!v.is_integer() || v.as_int() < 0) return false;
  *out = v.as_int();
  return true;
}

Status parse_metadata(const json::Value& v, SafeTensors* out) {
  if (!v.is_object()) return parse_error("__metadata__ must be an object of strings");
  for (const auto& [key, value] : v.members()) {
    if (!value.is_string()) {
      return parse_error("__metadata__[\"" + key + "\"] must be a string");
    }
    if (!out->metadata.emplace(key, value.as_string()).second) {
      return parse_error("__metadata__ key \"" + key + "\" appears twice");
    }
  }
  return Status::Ok();
}

Status parse_tensor_entry(const std::string& name, const json::Value& v, SafeTensor* t,
                          int64_t* begin, int64_t* end) {
  auto fail = [&](const std::string& what) {
    return parse_error("tensor \"" + name + "\": " + what);
  };
  if (!v.is_object()) return fail("entry must be an object");
  const json::Value* dtype = nullptr;
  const json::Value* shape = nullptr;
  const json::Value* offsets = nullptr;
  for (const auto& [key, value] : v.members()) {
    const json::Value** slot = key == "dtype"          ? &dtype
                               : key == "shape"        ? &shape
                               : key == "data_offsets" ? &offsets
                                                       : nullptr;
    if (!slot) return fail("unknown field \"" + key + "\"");
    if (*slot) return fail("field \"" + key + "\" appears twice");
    *slot = &value;
  }
  if (!dtype || !shape || !offsets) return fail("needs dtype, shape and data_offsets");
  if (!dtype->is_string()) return fail("dtype must be a string");
  std::optional<DType> d = parse_safetensors_dtype(dtype->as_string());
  if (!d) {
    return fail("dtype \"" + dtype->as_string() +
                "\" is not supported (F32, F16, BF16, F8_E4M3, F8_E5M2, I32, U8)");
  }
  t->dtype = *d;
  if (!shape->is_array()) return fail("shape must be an array");
  int64_t numel = 1;
  for (const json::Value& dim : shape->items()) {
    int64_t n = 0;
    if (!non_negative_integer(dim, &n)) return fail("shape entries must be non-negative integers");
    t->shape.push_back(n);
  }
  // Checked after every dimension is read so that a 0 anywhere makes any shape legal.
  bool has_zero = std::find(t->shape.begin(), t->shape.end(), 0) != t->shape.end();
  if (has_zero) {
    numel = 0;
  } else {
    for (int64_t n : t->shape) {
      if (numel > std::numeric_limits<int64_t>::max() / n) {
        return fail("shape's element count overflows 64 bits");
      }
      numel *= n;
    }
  }
  const int64_t elem = static_cast<int64_t>(dtype_size(t->dtype));
  if (numel > std::numeric_limits<int64_t>::max() / elem) {
    return fail("shape's byte size overflows 64 bits");
  }
  if (!offsets->is_array() || offsets->items().size() != 2 ||
      !non_negative_integer(offsets->items()[0], begin) ||
      !non_negative_integer(offsets->items()[1], end)) {
    return fail("data_offsets must be [begin, end], non-negative integers");
  }
  if (*end < *begin) return fail("data_offsets end is before begin");
  if (*end - *begin != numel * elem) {
    return fail("data_offsets span " + std::to_string(*end - *begin) +
                " bytes but shape and dtype need " + std::to_string(numel * elem));
  }
  return Status::Ok();
}

}  // namespace

int64_t SafeTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafeTensor* SafeTensors::find(std::string_view name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

Status parse_safetensors(const uint8_t* data, size_t size, SafeTensors* out) {
  *out = SafeTensors();
  if (size < 8) {
    return parse_error("file is " + std::to_string(size) +
                       " bytes, too short for the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kMaxHeaderBytes) {
    return parse_error("header length " + std::to_string(header_len) + " exceeds the limit of " +
                       std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (header_len > size - 8) {
    return parse_error("header length " + std::to_string(header_len) + " exceeds the " +
                       std::to_string(size - 8) + " bytes that follow it");
  }
  std::string_view header(reinterpret_cast<const char*>(data + 8), header_len);
  if (header.empty() || header.front() != '{') {
    return parse_error("header must be a JSON object starting with '{'");
  }
  json::Value root;
  Status parsed = json::parse(header, &root);
  if (!parsed.ok()) return parse_error("bad header: " + parsed.message());
  if (!root.is_object()) return parse_error("header must be a JSON object");

  const uint8_t* buffer = data + 8 + header_len;
  const int64_t buffer_size = static_cast<int64_t>(size - 8 - header_len);
  struct Range {
    int64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  bool seen_metadata = false;
  for (const auto& [name, value] : root.members()) {
    if (name == "__metadata__") {
      if (seen_metadata) return parse_error("__metadata__ appears twice");
      seen_metadata = true;
      KVATTN_RETURN_IF_ERROR(parse_metadata(value, out));
      continue;
    }
    if (out->tensors.count(name)) return parse_error("tensor \"" + name + "\" appears twice");
    SafeTensor t;
    int64_t begin = 0, end = 0;
    KVATTN_RETURN_IF_ERROR(parse_tensor_entry(name, value, &t, &begin, &end));
    if (end > buffer_size) {
      return parse_error("tensor \"" + name + "\": data_offsets [" + std::to_string(begin) + ", " +
                         std::to_string(end) + "] leave the " + std::to_string(buffer_size) +
                         "-byte data buffer");
    }
    t.bytes = std::span<const uint8_t>(buffer + begin, static_cast<size_t>(end - begin));
    auto [it, inserted] = out->tensors.emplace(name, std::move(t));
    if (end > begin) ranges.push_back({begin, end, &it->first});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return parse_error("tensors \"" + *ranges[i - 1].name + "\" and \"" + *ranges[i].name +
                         "\" overlap in the data buffer");
    }
  }
  return Status::Ok();
}

Status read_safetensors_file(const std::string& path, SafeTensorsFile* out) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return make_error(ErrorCode::kIoError, "cannot open '", path, "' for reading");
  std::streamoff size = in.tellg();
  if (size < 0) return make_error(ErrorCode::kIoError, "cannot size '", path, "'");
  out->bytes.resize(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char*>(out->bytes.data()), size)) {
    return make_error(ErrorCode::kIoError, "cannot read '", path, "'");
  }
  Status s = parse_safetensors(out->bytes.data(), out->bytes.size(), &out->contents);
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  return Status::Ok();
}

Status serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                             const std::map<std::string, std::string, std::less<>>& metadata,
                             std::vector<uint8_t>* out) {
  std::vector<const TensorToWrite*> order;
  for (const TensorToWrite& t : tensors) {
    if (t.name == "__metadata__") return parse_error("a tensor cannot be named __metadata__");
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
        return parse_error("tensor \"" + t.name + "\": bad shape");
      }
    }
    if (static_cast<uint64_t>(numel) * dtype_size(t.dtype) != t.bytes.size()) {
      return parse_error("tensor \"" + t.name + "\": " + std::to_string(t.bytes.size()) +
                         " bytes given for shape that needs " +
                         std::to_string(numel * dtype_size(t.dtype)));
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    if (dtype_size(a->dtype) != dtype_size(b->dtype)) {
      return dtype_size(a->dtype) > dtype_size(b->dtype);
    }
    return a->name < b->name;
  });
  std::set<std::string_view> names;
  for (const TensorToWrite* t : order) {
    if (!names.insert(t->name).second) {
      return parse_error("tensor \"" + t->name + "\" given twice");
    }
  }
  std::vector<std::pair<std::string, json::Value>> members;
  if (!metadata.empty()) {
    std::vector<std::pair<std::string, json::Value>> meta;
    for (const auto& [k, v] : metadata) meta.emplace_back(k, json::Value::string(v));
    members.emplace_back("__metadata__", json::Value::object(std::move(meta)));
  }
  int64_t offset = 0;
  for (const TensorToWrite* t : order) {
    std::vector<json::Value> shape;
    for (int64_t d : t->shape) shape.push_back(json::Value::integer(d));
    int64_t end = offset + static_cast<int64_t>(t->bytes.size());
    members.emplace_back(
        t->name, json::Value::object({
                     {"dtype", json::Value::string(std::string(safetensors_dtype_name(t->dtype)))},
                     {"shape", json::Value::array(std::move(shape))},
                     {"data_offsets", json::Value::array({json::Value::integer(offset),
                                                          json::Value::integer(end)})},
                 }));
    offset = end;
  }
  std::string header = json::serialize(json::Value::object(std::move(members)));
  // Padding the header with spaces to a multiple of 8 keeps the data buffer 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  out->clear();
  out->reserve(8 + header.size() + static_cast<size_t>(offset));
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(n >> (8 * i)));
  out->insert(out->end(), header.begin(), header.end());
  for (const TensorToWrite* t : order) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t->bytes.data());
    out->insert(out->end(), p, p + t->bytes.size());
  }
  return Status::Ok();
}

Status write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return make_error(ErrorCode::kIoError, "cannot open '", path, "' for writing");
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return make_error(ErrorCode::kIoError, "cannot write '", path, "'");
  return Status::Ok();
}

Status write_safetensors_file(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string, std::less<>>& metadata) {
  std::vector<uint8_t> bytes;
  KVATTN_RETURN_IF_ERROR(serialize_safetensors(tensors, metadata, &bytes));
  return write_file(path, bytes);
}

}  // namespace kvattn::io
