// Shared by the decode tests (decode_test.cc, decode_head_steps_test.cc, decode_nan_test.cc):
// the decode kernels the tests name through the kernel table, and whether this machine runs
// one.
#pragma once

#include <random>
#include <string>
#include <string_view>

#include "core/cpu_features.h"
#include "cpu/decode/decode.h"
#include "cpu/kernel_table.h"
#include "kvattn/status.h"
#include "kvattn/tensor.h"
#include "testing/case_builder.h"

namespace kvattn::cputest {

inline constexpr int kTile = cpu::kDecodeTileKeys;

// The FP8 table-widening kernels (decode_fp8_table.h), with fp32 FMAs or bf16 dot
// products, and the bf16 dot-product kernel over bf16 caches (decode_bf16_dot_avx512bf16.cc),
// named through the kernel table; decode_test.cc checks them on their own grid (both FP8 types or
// bf16, head dims 64/128/256, GQA groups 1-16, lengths around the 32-key tile and the pair of keys
// PV takes, both layouts, pages of 16 and 5 (bf16: and 1), every variant they take, split into
// chunks too).
inline constexpr std::string_view kFp8TableFma = "decode-avx512vbmi-fp8table-fma-k32";
inline constexpr std::string_view kFp8TableDot = "decode-avx512bf16-fp8table-dot-k32";
inline constexpr std::string_view kBf16Dot = "decode-avx512bf16-dot-k32";
inline constexpr std::string_view kFma512 = "decode-avx512-fma-k32";
inline constexpr std::string_view kFmaAvx2 = "decode-avx2-fma-k32";
// The same table widening onto AMX-BF16 tiles (decode_fp8_amx.cc), and that kernel body on
// emulated tiles (common/amx.h: any CPU with AVX512_BF16 and VBMI).
inline constexpr std::string_view kFp8Amx = "decode-amx-bf16-fp8table-k32";
inline constexpr std::string_view kFp8AmxEmulated = "decode-amx-bf16-fp8table-k32-emulated";

// The kernel named `name` where this machine runs it, else nullptr and the reason in `why`.
inline const cpu::CpuKernel* runnable(std::string_view name, std::string* why) {
  const cpu::CpuKernel* k = cpu::find_cpu_kernel(name);
  if (k == nullptr) {
    *why = std::string(name) + " is not built (no x86 kernels)";
    return nullptr;
  }
  Status here = cpu::kernel_runs_on(*k, detail::cpu_features().best, detail::cpu_features());
  if (!here.ok()) {
    *why = std::string(name) + ": " + here.message();
    return nullptr;
  }
  return k;
}

// A random decode problem (decode_test.cc); `i` cycles through the enumerations (variants, dtypes,
// head dims, layouts, page sizes, lengths around the tile) so that every value of each appears
// within a few dozen problems whatever the random draws.
testing::CaseSpec random_decode_spec(int i, std::mt19937& rng);

// Writes `code` (the cache's element type T) over the element of paged cache `cache` (strides of
// page, slot, head, dim for NHD; page, head, slot, dim for HND) at token `token` of request b, KV
// head `head`, dim d of case c.
template <class T>
void poke_paged(const testing::Case& c, const TensorView& cache, int b, int64_t token, int head,
                int d, T code) {
  const int page_size = c.spec().problem.page_size;
  const bool nhd = c.spec().problem.kv_layout == KVLayout::kNHD;
  const int64_t page = c.kv_indices[c.kv_indptr[b] + token / page_size];
  const int64_t at = page * cache.strides[0] +
                     (token % page_size) * cache.strides[nhd ? 1 : 2] +
                     head * cache.strides[nhd ? 2 : 1] + d * cache.strides[3];
  static_cast<T*>(cache.data)[at] = code;
}

}  // namespace kvattn::cputest
