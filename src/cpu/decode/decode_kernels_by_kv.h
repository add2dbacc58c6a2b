// The decode kernels of one ISA level and one KV dtype, each in its own file so that the longest
// files of the build compile side by side: decode_kernel.h's per vector level
// (decode_kernels_<isa>_<kv>.cc, generated from decode_kernels_isa_kv.cc.in;
// find_decode_kernel_<isa> in decode_<isa>.cc picks among them by KV dtype) and the FP8-table ones
// (below). Each returns nullptr where no kernel fits.
#pragma once

#include "cpu/decode/decode.h"

namespace kvattn::cpu {

// One ISA level's kernels, one entry per KV dtype.
struct DecodeKernelsByKv {
  using Find = DecodeItemFn (*)(int dqk, int dvo, int group_padded);
  Find f32, f16, bf16, e4m3, e5m2;

  DecodeItemFn find(DType kv, int dqk, int dvo, int group_padded) const {
    switch (kv) {
      case DType::kF32:
        return f32(dqk, dvo, group_padded);
      case DType::kF16:
        return f16(dqk, dvo, group_padded);
      case DType::kBF16:
        return bf16(dqk, dvo, group_padded);
      case DType::kE4M3:
        return e4m3(dqk, dvo, group_padded);
      case DType::kE5M2:
        return e5m2(dqk, dvo, group_padded);
      default:
        return nullptr;
    }
  }
};

DecodeItemFn find_decode_kernel_avx2_f32(int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx2_f16(int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx2_bf16(int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx2_e4m3(int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx2_e5m2(int dqk, int dvo, int group_padded);

DecodeItemFn find_decode_kernel_avx512_f32(int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx512_f16(int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx512_bf16(int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx512_e4m3(int dqk, int dvo, int group_padded);
DecodeItemFn find_decode_kernel_avx512_e5m2(int dqk, int dvo, int group_padded);

// FP8 caches widened by byte tables (decode_fp8_table.h, one file per FP8 dtype:
// decode_fp8_table_<kv>_avx512bf16.cc; find_decode_kernel_fp8_table_avx512 of decode.h picks
// between them): head dim d = 64, 128, 256 (equal K and V dims).
DecodeItemFn find_decode_kernel_fp8_table_avx512_e4m3(int d, int group_padded, bool bf16_dot);
DecodeItemFn find_decode_kernel_fp8_table_avx512_e5m2(int d, int group_padded, bool bf16_dot);

}  // namespace kvattn::cpu
