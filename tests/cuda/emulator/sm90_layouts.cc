// The SM90 CTA emulator's operand layouts (sm90_emulator.h): wgmma operand types, matrix
// descriptors and their swizzles, and tensor maps encoded as cuTensorMapEncodeTiled checks them.
#include <cstdint>
#include <string>

#include "cuda/emulator/sm90_emulator.h"

namespace kvattn::fa3::emu {

int wgmma_type_bytes(WgmmaType t) { return t == WgmmaType::kBf16 || t == WgmmaType::kF16 ? 2 : 1; }
const char* wgmma_type_name(WgmmaType t) {
  switch (t) {
    case WgmmaType::kBf16:
      return "bf16";
    case WgmmaType::kF16:
      return "f16";
    case WgmmaType::kE4m3:
      return "e4m3";
    case WgmmaType::kE5m2:
      return "e5m2";
  }
  return "?";
}

int swizzle_span_bytes(Swizzle s) {
  switch (s) {
    case Swizzle::kNone:
      return 16;
    case Swizzle::k32B:
      return 32;
    case Swizzle::k64B:
      return 64;
    case Swizzle::k128B:
      return 128;
  }
  return 16;
}
// Swizzle<B, 4, 3>: the 16-byte chunk index (bits 4 .. 4+B-1) XORed with bits 7 .. 7+B-1.
uint32_t swizzle_address(Swizzle s, uint32_t a) {
  const uint32_t mask = s == Swizzle::k128B  ? 7u
                        : s == Swizzle::k64B ? 3u
                        : s == Swizzle::k32B ? 1u
                                             : 0u;
  return a ^ (((a >> 7) & mask) << 4);
}

MatrixDesc decode_desc(uint64_t bits) {
  MatrixDesc d;
  d.start = uint32_t(bits & 0x3FFFu) << 4;
  d.lbo = uint32_t((bits >> 16) & 0x3FFFu) << 4;
  d.sbo = uint32_t((bits >> 32) & 0x3FFFu) << 4;
  d.base_offset = uint32_t((bits >> 49) & 7u);
  d.layout = Swizzle(uint32_t(bits >> 62) & 3u);
  return d;
}
uint64_t encode_desc(const MatrixDesc& d) {
  return uint64_t((d.start >> 4) & 0x3FFFu) | (uint64_t((d.lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((d.sbo >> 4) & 0x3FFFu) << 32) | (uint64_t(d.base_offset & 7u) << 49) |
         (uint64_t(d.layout) << 62);
}

uint32_t desc_address(const MatrixDesc& d, bool mn_major, int mn, int k, int eb) {
  const uint32_t T = uint32_t(16 / eb);  // elements per 16 bytes
  const uint32_t span = uint32_t(swizzle_span_bytes(d.layout));
  const uint32_t umn = uint32_t(mn), uk = uint32_t(k), ueb = uint32_t(eb);
  uint32_t a;
  if (!mn_major) {
    if (d.layout == Swizzle::kNone) {
      a = d.start + (umn % 8) * 16 + (umn / 8) * d.sbo + (uk % T) * ueb + (uk / T) * d.lbo;
    } else {
      a = d.start + (umn % 8) * span + (umn / 8) * d.sbo + uk * ueb;
    }
  } else {
    if (d.layout == Swizzle::kNone) {
      a = d.start + (umn % T) * ueb + (umn / T) * d.sbo + (uk % 8) * 16 + (uk / 8) * d.lbo;
    } else {
      const uint32_t row = span / ueb;  // elements along MN in one swizzled row
      a = d.start + (umn % row) * ueb + (umn / row) * d.lbo + (uk % 8) * span + (uk / 8) * d.sbo;
    }
  }
  return swizzle_address(d.layout, a);
}

// ---------------------------------------------------------------------------------------------
// Tensor maps.

uint32_t TensorMap::box_bytes() const {
  uint32_t n = uint32_t(elem_bytes);
  for (int i = 0; i < rank; ++i) n *= box[i];
  return n;
}

namespace {
[[noreturn]] void encode_error(const std::string& what) {
  throw EmulatorError("cuTensorMapEncodeTiled: " + what);
}
}  // namespace

TensorMap encode_tensor_map_tiled(WgmmaType type, int rank, const void* global,
                                  const uint64_t* dims, const uint64_t* strides,
                                  const uint32_t* box, const uint32_t* elem_strides,
                                  Swizzle swizzle) {
  TensorMap m;
  m.type = type;
  m.elem_bytes = wgmma_type_bytes(type);
  if (rank < 1 || rank > 5) encode_error("tensorRank " + std::to_string(rank) + " not in 1..5");
  m.rank = rank;
  if (global == nullptr || reinterpret_cast<uintptr_t>(global) % 16 != 0) {
    encode_error("globalAddress must be 16-byte aligned");
  }
  m.global = global;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 1 || dims[i] > (uint64_t(1) << 32)) {
      encode_error("globalDim[" + std::to_string(i) + "] = " + std::to_string(dims[i]) +
                   " not in 1..2^32");
    }
    m.dims[i] = dims[i];
    if (box[i] < 1 || box[i] > 256) {
      encode_error("boxDim[" + std::to_string(i) + "] = " + std::to_string(box[i]) +
                   " not in 1..256");
    }
    m.box[i] = box[i];
    if (elem_strides[i] < 1 || elem_strides[i] > 8) {
      encode_error("elementStrides[" + std::to_string(i) +
                   "] = " + std::to_string(elem_strides[i]) + " not in 1..8");
    }
    if (elem_strides[i] != 1) encode_error("elementStrides other than 1: not modelled");
  }
  m.strides[0] = uint64_t(m.elem_bytes);
  for (int i = 1; i < rank; ++i) {
    const uint64_t s = strides[i - 1];
    if (s % 16 != 0) {
      encode_error("globalStrides[" + std::to_string(i - 1) + "] = " + std::to_string(s) +
                   " bytes is not a multiple of 16");
    }
    if (s >= (uint64_t(1) << 40)) {
      encode_error("globalStrides[" + std::to_string(i - 1) + "] = " + std::to_string(s) +
                   " is not below 2^40");
    }
    m.strides[i] = s;
  }
  const uint32_t inner = box[0] * uint32_t(m.elem_bytes);
  if (inner % 16 != 0) {
    encode_error("boxDim[0] * elementSize = " + std::to_string(inner) +
                 " bytes is not a multiple of 16 (interleave NONE)");
  }
  if (swizzle != Swizzle::kNone && inner > uint32_t(swizzle_span_bytes(swizzle))) {
    encode_error("boxDim[0] * elementSize = " + std::to_string(inner) + " bytes exceeds the " +
                 std::to_string(swizzle_span_bytes(swizzle)) + "-byte swizzle span");
  }
  m.swizzle = swizzle;
  return m;
}

}  // namespace kvattn::fa3::emu
