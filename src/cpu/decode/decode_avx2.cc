// Decode kernels for the avx2 level, compiled with only its flags (src/cpu/CMakeLists.txt).
#include "cpu/decode/decode_kernel.h"
#include "cpu/common/simd_avx2.h"

namespace kvattn::cpu {

DecodeItemFn find_decode_kernel_avx2(DType kv, int dqk, int dvo, int group_padded) {
  return decode_detail::find_kernel<avx2::Simd>(kv, dqk, dvo, group_padded);
}

}  // namespace kvattn::cpu
