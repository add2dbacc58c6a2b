// Decode kernels for the scalar level, compiled with only its flags (src/cpu/CMakeLists.txt).
#include "cpu/common/simd_scalar.h"
#include "cpu/decode/decode_instances.h"

namespace kvattn::cpu {

DecodeItemFn find_decode_kernel_scalar(DType kv, int dqk, int dvo, int group_padded) {
  return decode_detail::find_kernel<scalar::Simd>(kv, dqk, dvo, group_padded);
}

}  // namespace kvattn::cpu
