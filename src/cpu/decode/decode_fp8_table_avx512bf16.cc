// The FP8-table decode kernels (decode_fp8_table.h) by FP8 dtype, each dtype's in its own file
// (decode_fp8_table_<kv>_avx512bf16.cc), compiled with the AVX512_BF16 + AVX512_VBMI flags
// (src/cpu/CMakeLists.txt).
#include "cpu/decode/decode_kernels_by_kv.h"

namespace kvattn::cpu {

DecodeItemFn find_decode_kernel_fp8_table_avx512(DType kv, int dqk, int dvo, int group_padded,
                                                 bool bf16_dot) {
  if (dqk != dvo) return nullptr;
  if (kv == DType::kE4M3)
    return find_decode_kernel_fp8_table_avx512_e4m3(dqk, group_padded, bf16_dot);
  if (kv == DType::kE5M2)
    return find_decode_kernel_fp8_table_avx512_e5m2(dqk, group_padded, bf16_dot);
  return nullptr;
}

}  // namespace kvattn::cpu
