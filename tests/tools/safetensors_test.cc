// The .safetensors reader and writer: round trips, and every class of malformed file is a
// kParseError (never a crash; the tests run under ASan/UBSan in CI).
#include "tools/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/tools/temp_path.h"
#include "tools/json.h"

namespace kvattn::io {
namespace {

using Metadata = std::map<std::string, std::string, std::less<>>;

std::vector<std::byte> bytes_of(size_t n, uint8_t seed) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(seed + i * 7);
  return b;
}

// A file from a raw header text and a data buffer of `data_bytes` bytes.
std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> f(8 + header.size() + data_bytes, 0xAB);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(f.data() + 8, header.data(), header.size());
  return f;
}

Status parse(const std::vector<uint8_t>& f, SafeTensors* st) {
  return parse_safetensors(f.data(), f.size(), st);
}

void expect_parse_error(const std::vector<uint8_t>& f, const std::string& needle) {
  SafeTensors st;
  Status s = parse(f, &st);
  EXPECT_EQ(s.code(), ErrorCode::kParseError) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "message should mention '" << needle << "': " << s.message();
}

TEST(SafeTensorsTest, RoundTripEveryDType) {
  const DType dtypes[] = {DType::kF32,  DType::kF16, DType::kBF16, DType::kE4M3,
                          DType::kE5M2, DType::kI32, DType::kU8};
  std::vector<std::vector<std::byte>> storage;
  std::vector<TensorToWrite> tensors;
  int i = 0;
  for (DType d : dtypes) {
    std::vector<int64_t> shape = {3, i + 1, 5};
    storage.push_back(bytes_of(static_cast<size_t>(15 * (i + 1)) * dtype_size(d), uint8_t(i)));
    tensors.push_back({"t_" + std::string(dtype_name(d)), d, shape, storage.back()});
    ++i;
  }
  storage.push_back({});
  tensors.push_back({"empty", DType::kF32, {0, 4}, storage.back()});
  storage.push_back(bytes_of(4, 9));
  tensors.push_back({"scalar", DType::kI32, {}, storage.back()});
  Metadata meta = {{"op", "batch_decode"}, {"quote\"and\\slash", "line\nbreak"}};

  std::vector<uint8_t> file;
  ASSERT_TRUE(serialize_safetensors(tensors, meta, &file).ok());
  // Header padded so the data buffer is 8-byte aligned.
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);

  SafeTensors st;
  ASSERT_TRUE(parse(file, &st).ok());
  EXPECT_EQ(st.metadata, meta);
  ASSERT_EQ(st.tensors.size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    const SafeTensor* got = st.find(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->dtype, t.dtype) << t.name;
    EXPECT_EQ(got->shape, t.shape) << t.name;
    ASSERT_EQ(got->bytes.size(), t.bytes.size()) << t.name;
    EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(),
                           reinterpret_cast<const std::byte*>(got->bytes.data())))
        << t.name;
    // Each tensor is aligned to its element size inside the file.
    const auto offset = static_cast<size_t>(got->bytes.data() - file.data());
    EXPECT_EQ(offset % dtype_size(t.dtype), 0u) << t.name;
  }
}

TEST(SafeTensorsTest, ReadsWhatOtherWritersProduce) {
  // As the reference (Rust/Python) writer lays it out: metadata first, header padded with spaces.
  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]},)"
      R"("a":{"dtype":"F8_E5M2","shape":[2,2],"data_offsets":[0,4]}}    )";
  SafeTensors st;
  ASSERT_TRUE(parse(raw_file(header, 8), &st).ok());
  EXPECT_EQ(st.metadata.at("format"), "pt");
  EXPECT_EQ(st.find("a")->dtype, DType::kE5M2);
  EXPECT_EQ(st.find("b")->bytes.size(), 4u);
}

TEST(SafeTensorsTest, FileRoundTrip) {
  std::vector<std::byte> data = bytes_of(24, 3);
  std::string path = temp_path("kvattn_st_roundtrip.safetensors");
  ASSERT_TRUE(write_safetensors_file(path, {{"x", DType::kF32, {2, 3}, data}}, {{"k", "v"}}).ok());
  SafeTensorsFile f;
  ASSERT_TRUE(read_safetensors_file(path, &f).ok());
  EXPECT_EQ(f.contents.find("x")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(read_safetensors_file(path + ".missing", &f).code(), ErrorCode::kIoError);
}

TEST(SafeTensorsTest, BadHeaderLength) {
  expect_parse_error({}, "too short");
  expect_parse_error({1, 0, 0}, "too short");
  std::vector<uint8_t> f = raw_file("{}", 0);
  f[0] = 200;  // longer than the file
  expect_parse_error(f, "exceeds");
  f = raw_file("{}", 0);
  f[7] = 0x80;  // 2^63
  expect_parse_error(f, "exceeds the limit");
  f = raw_file("{}", 0);
  f[4] = 0x01;  // 4 GiB: over the 100 MiB header limit
  expect_parse_error(f, "exceeds the limit");
}

TEST(SafeTensorsTest, BadJson) {
  expect_parse_error(raw_file("", 0), "JSON object");
  expect_parse_error(raw_file("[1,2]", 0), "JSON object");
  expect_parse_error(raw_file("{\"a\":", 0), "JSON");
  expect_parse_error(raw_file("{\"a\":{}} x", 0), "JSON");
  expect_parse_error(raw_file("{\"a\" 1}", 0), "JSON");
  expect_parse_error(raw_file("{\"a\":\"\\q\"}", 0), "JSON");
  expect_parse_error(raw_file("{\"a\":\"\\ud800\"}", 0), "JSON");
  expect_parse_error(raw_file("{\"a\":01}", 0), "JSON");
  expect_parse_error(raw_file(std::string("{\"a\":\"x\x01\"}"), 0), "JSON");
  // Nesting deep enough to overflow a naive recursive parser's stack.
  expect_parse_error(raw_file("{\"a\":" + std::string(100000, '[') + "}", 0), "nesting");
}

TEST(SafeTensorsTest, UnknownDType) {
  expect_parse_error(raw_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8),
                     "F64");
  expect_parse_error(raw_file(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1),
                     "not supported");
  expect_parse_error(raw_file(R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1), "dtype");
}

TEST(SafeTensorsTest, OffsetsOutOfRangeOrOverlapping) {
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}})", 8),
                     "leave");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[7,9]}})", 8),
                     "leave");
  expect_parse_error(
      raw_file(
          R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[9223372036854775806,9223372036854775807]}})",
          8),
      "leave");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 8),
                     "before begin");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", 8),
                     "non-negative");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 8),
                     "data_offsets");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}})",
                              8),
                     "overlap");
  // Zero-size tensors take no bytes and overlap nothing.
  SafeTensors st;
  EXPECT_TRUE(parse(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[0,3],"data_offsets":[2,2]}})",
                             4),
                    &st)
                  .ok());
}

TEST(SafeTensorsTest, ShapeByteSizeMismatch) {
  expect_parse_error(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                     "need 12");
  expect_parse_error(raw_file(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,4]}})", 8),
                     "need 8");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,0]}})", 8),
                     "non-negative integers");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})", 8),
                     "non-negative integers");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":"4","data_offsets":[0,4]}})", 8),
                     "shape must be an array");
}

TEST(SafeTensorsTest, HugeShapesOverflow) {
  expect_parse_error(
      raw_file(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 8),
      "overflows");
  expect_parse_error(
      raw_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", 8),
      "overflows");
  expect_parse_error(
      raw_file(R"({"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,0]}})", 8),
      "non-negative integers");
  // A zero anywhere makes the product 0, however large the rest.
  SafeTensors st;
  EXPECT_TRUE(parse(raw_file(R"({"a":{"dtype":"U8","shape":[9223372036854775807,0],)"
                             R"("data_offsets":[0,0]}})",
                             0),
                    &st)
                  .ok());
}

TEST(SafeTensorsTest, DuplicatesAndStructure) {
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                              R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                              2),
                     "appears twice");
  expect_parse_error(raw_file(R"({"__metadata__":{"k":"1","k":"2"}})", 0), "appears twice");
  expect_parse_error(raw_file(R"({"__metadata__":{},"__metadata__":{}})", 0), "appears twice");
  expect_parse_error(raw_file(R"({"__metadata__":{"k":1}})", 0), "must be a string");
  expect_parse_error(raw_file(R"({"__metadata__":["k"]})", 0), "object of strings");
  expect_parse_error(raw_file(R"({"a":[1]})", 0), "must be an object");
  expect_parse_error(raw_file(R"({"a":{"dtype":"U8","shape":[1]}})", 1), "needs dtype");
  expect_parse_error(
      raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":0}})", 1),
      "unknown field");
  expect_parse_error(
      raw_file(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
      "appears twice");
}

TEST(SafeTensorsTest, WriterRejectsInconsistentTensors) {
  std::vector<std::byte> data = bytes_of(8, 0);
  std::vector<uint8_t> out;
  EXPECT_EQ(serialize_safetensors({{"a", DType::kF32, {3}, data}}, {}, &out).code(),
            ErrorCode::kParseError);
  EXPECT_EQ(
      serialize_safetensors({{"a", DType::kF32, {2}, data}, {"a", DType::kU8, {8}, data}}, {}, &out)
          .code(),
      ErrorCode::kParseError);
  EXPECT_EQ(serialize_safetensors({{"__metadata__", DType::kU8, {8}, data}}, {}, &out).code(),
            ErrorCode::kParseError);
}

// Every truncation and many random corruptions of a valid file parse or fail cleanly.
TEST(SafeTensorsTest, CorruptedFilesNeverCrash) {
  std::vector<std::byte> a = bytes_of(64, 1), b = bytes_of(6, 2);
  std::vector<uint8_t> file;
  ASSERT_TRUE(serialize_safetensors({{"a", DType::kF32, {4, 4}, a}, {"b", DType::kU8, {2, 3}, b}},
                                    {{"op", "batch_decode"}}, &file)
                  .ok());
  for (size_t n = 0; n < file.size(); ++n) {
    SafeTensors st;
    Status s = parse_safetensors(file.data(), n, &st);
    EXPECT_EQ(s.code(), ErrorCode::kParseError) << "truncated to " << n;
  }
  std::mt19937 rng(7);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> f = file;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      size_t pos = rng() % f.size();
      f[pos] = rng() % 3 == 0 ? static_cast<uint8_t>("{}[]\":,0123456789-e"[rng() % 19])
                              : static_cast<uint8_t>(rng());
    }
    // An exact-size copy so that ASan sees any read past the end.
    std::unique_ptr<uint8_t[]> exact(new uint8_t[f.size()]);
    std::memcpy(exact.get(), f.data(), f.size());
    SafeTensors st;
    Status s = parse_safetensors(exact.get(), f.size(), &st);
    if (s.ok()) {
      ++parsed;
      for (const auto& [name, t] : st.tensors) {
        EXPECT_GE(t.bytes.data(), exact.get());
        EXPECT_LE(t.bytes.data() + t.bytes.size(), exact.get() + f.size());
        EXPECT_EQ(static_cast<int64_t>(t.bytes.size()), t.numel() * int64_t(dtype_size(t.dtype)));
      }
    } else {
      ++rejected;
      EXPECT_EQ(s.code(), ErrorCode::kParseError) << s.to_string();
    }
  }
  // Both outcomes occur: corruption of tensor bytes parses, corruption of the header does not.
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

TEST(JsonTest, ParsesAndSerializes) {
  json::Value v;
  ASSERT_TRUE(
      json::parse(R"( {"a": [1, -2, 3.5, true, false, null], "s": "\u00e9\ud83d\ude00\n"} )", &v)
          .ok());
  ASSERT_TRUE(v.is_object());
  const json::Value* a = v.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 6u);
  EXPECT_EQ(a->items()[1].as_int(), -2);
  EXPECT_FALSE(a->items()[2].is_integer());
  EXPECT_DOUBLE_EQ(a->items()[2].as_double(), 3.5);
  EXPECT_EQ(v.find("s")->as_string(), "\xc3\xa9\xf0\x9f\x98\x80\n");
  EXPECT_EQ(json::serialize(v), R"({"a":[1,-2,3.5,true,false,null],"s":"é😀\n"})");
  json::Value back;
  ASSERT_TRUE(json::parse(json::serialize(v), &back).ok());
  EXPECT_EQ(json::serialize(back), json::serialize(v));
  EXPECT_EQ(json::parse("1e999", &v).code(), ErrorCode::kParseError);
  EXPECT_EQ(json::parse("tru", &v).code(), ErrorCode::kParseError);
  EXPECT_EQ(json::parse("\"abc", &v).code(), ErrorCode::kParseError);
  EXPECT_EQ(json::parse("-", &v).code(), ErrorCode::kParseError);
  EXPECT_EQ(json::parse("1.", &v).code(), ErrorCode::kParseError);
}

}  // namespace
}  // namespace kvattn::io
