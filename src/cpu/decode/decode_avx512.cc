// Decode kernels for the avx512 level, compiled with only its flags (src/cpu/CMakeLists.txt).
#include "cpu/decode/decode_kernel.h"
#include "cpu/common/simd_avx512.h"

namespace kvattn::cpu {

DecodeItemFn find_decode_kernel_avx512(DType kv, int dqk, int dvo, int group_padded) {
  return decode_detail::find_kernel<avx512::Simd>(kv, dqk, dvo, group_padded);
}

}  // namespace kvattn::cpu
