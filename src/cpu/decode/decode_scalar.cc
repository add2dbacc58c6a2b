// Decode kernels for the scalar level, by KV dtype: each dtype's kernels are in their own file
// (decode_kernels_scalar_<kv>.cc, decode_kernels_by_kv.h) compiled with only this level's flags
// (src/cpu/CMakeLists.txt).
#include "cpu/decode/decode_kernels_by_kv.h"

namespace kvattn::cpu {

DecodeItemFn find_decode_kernel_scalar(DType kv, int dqk, int dvo, int group_padded) {
  static constexpr DecodeKernelsByKv kKernels{
      &find_decode_kernel_scalar_f32, &find_decode_kernel_scalar_f16,
      &find_decode_kernel_scalar_bf16, &find_decode_kernel_scalar_e4m3,
      &find_decode_kernel_scalar_e5m2};
  return kKernels.find(kv, dqk, dvo, group_padded);
}

}  // namespace kvattn::cpu
