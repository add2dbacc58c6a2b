// The .safetensors format (what PyTorch and numpy users exchange tensors in): an 8-byte
// little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte buffer that
// follows the header) plus an optional "__metadata__" string-to-string map, then the bytes.
//
// The reader is fed untrusted files: everything malformed (bad header length, bad JSON, unknown
// dtype, offsets out of range or overlapping, shape/byte-size mismatch, duplicate names, shapes
// whose element count overflows) is a kParseError saying what is wrong, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/dtype.h"
#include "kvattn/status.h"

namespace kvattn::io {

// A header longer than this is refused (the reference implementation's limit as well): a
// corrupt length must not make the reader allocate or scan gigabytes.
inline constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct SafeTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // The tensor's bytes inside the parsed buffer (not owned).
  std::span<const uint8_t> bytes;
  int64_t numel() const;
};

struct SafeTensors {
  std::map<std::string, SafeTensor, std::less<>> tensors;
  std::map<std::string, std::string, std::less<>> metadata;
  const SafeTensor* find(std::string_view name) const;
};

// The safetensors dtype name ("F32", "BF16", "F8_E4M3", ...) of a kvattn dtype, and back.
std::string_view safetensors_dtype_name(DType dtype);
std::optional<DType> parse_safetensors_dtype(std::string_view name);

// Parses a whole file held in memory. `out` views `data`, which must outlive it.
Status parse_safetensors(const uint8_t* data, size_t size, SafeTensors* out);

// A file read into memory together with its parsed view.
struct SafeTensorsFile {
  std::vector<uint8_t> bytes;
  SafeTensors contents;
};
Status read_safetensors_file(const std::string& path, SafeTensorsFile* out);

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // contiguous, numel * dtype_size bytes
};

// Serializes tensors and metadata. Tensors are laid out by decreasing element size (then name),
// so that every tensor is aligned to its element size, as the reference writer does.
Status serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                             const std::map<std::string, std::string, std::less<>>& metadata,
                             std::vector<uint8_t>* out);
// Writes `bytes` to `path` (kIoError naming the path on failure).
Status write_file(const std::string& path, const std::vector<uint8_t>& bytes);
Status write_safetensors_file(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string, std::less<>>& metadata);

}  // namespace kvattn::io
