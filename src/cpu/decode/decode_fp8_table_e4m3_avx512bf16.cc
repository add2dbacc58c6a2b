// The FP8-table decode kernels (decode_fp8_table.h) for e4m3 caches, every head-dim, group-block
// and tile (bf16 dot or fp32 FMA) instantiation; the other FP8 dtype's are in their own file so
// that the two compile side by side.
#include "cpu/decode/decode_fp8_table.h"
#include "cpu/decode/decode_kernels_by_kv.h"

namespace kvattn::cpu {

DecodeItemFn find_decode_kernel_fp8_table_avx512_e4m3(int d, int group_padded, bool bf16_dot) {
  return pick_dim<DType::kE4M3>(d, group_padded, bf16_dot);
}

}  // namespace kvattn::cpu
