// The AVX2 decode kernel's blocks of 4 query rows (decode_fma_blocks.h: bf16 rows by parity, e4m3
// rows by quads) against the reference: every variant, layout and page size at head dims 64 /
// 128 / 256 and GQA groups 3 and 4; the e4m3 quads' folds at extreme scales and under the
// caller's DAZ.
#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <random>
#include <string>

#include "cpu_test_util.h"
#include "decode_test_util.h"

namespace kvattn::cputest {
namespace {

using testing::CaseSpec;

// The AVX2 kernel's blocks of 4 query rows (GQA groups 3 and 4, head dims 64 / 128 / 256) over a
// `kv` cache: every variant of random_decode_spec at every dim and both groups (fused RoPE
// included), both layouts, page sizes 1 / 16 / 5, lengths around the tile, every third problem
// again split into chunks of one tile.
void check_avx2_blocks_of_four(DType kv, unsigned seed) {
  std::string why;
  if (runnable(kFmaAvx2, &why) == nullptr) GTEST_SKIP() << why;
  const KernelOverride named(kFmaAvx2);
  std::mt19937 rng(seed);
  const int dims[] = {64, 128, 256};
  for (int i = 0; i < 48; ++i) {
    CaseSpec spec = random_decode_spec(i, rng);
    Problem& p = spec.problem;
    p.kv_dtype = kv;
    p.num_qo_heads = p.num_kv_heads * ((i / 8) % 2 ? 3 : 4);
    p.head_dim_qk = p.head_dim_vo = dims[i % 3];
    expect_matches_reference(spec, CpuIsa::kAvx2);
    if (i % 3 == 0) expect_matches_reference(spec, CpuIsa::kAvx2, {.kv_chunk_size = kTile});
  }
}

// bf16 rows read by parity (decode_fma_blocks.h, kParityRows): q and the output accumulators in
// parity order, QK two keys a pass (fused RoPE: PV by parity, QK on the rotated f32 rows).
TEST(CpuDecodeAvx2Parity, Bf16BlocksOfFourRowsMatchTheReference) {
  check_avx2_blocks_of_four(DType::kBF16, 7);
}

// e4m3 V rows read by quads (decode_fma_blocks.h, kQuadRows): the output accumulators in quad
// order, the weights folded by 2^60, NaN codes poisoned at their quad positions, the per-token
// and per-head scales random_decode_spec draws.
TEST(CpuDecodeAvx2Quads, E4m3BlocksOfFourRowsMatchTheReference) {
  check_avx2_blocks_of_four(DType::kE4M3, 11);
}

// Per-token V scales of 2^69..2^70 make the weights pass 2^68, where the quads' 2^60 fold would
// overflow f32: such tiles take pv_tile_quads' scalar path (kQuadMaxWeight). Per-token K scales
// as large keep the scores finite (~2^70).
TEST(CpuDecodeAvx2Quads, E4m3HugePerTokenScalesTakeTheScalarPath) {
  std::string why;
  if (runnable(kFmaAvx2, &why) == nullptr) GTEST_SKIP() << why;
  const KernelOverride named(kFmaAvx2);
  std::mt19937 rng(3);
  for (int i = 0; i < 6; ++i) {
    CaseSpec spec = random_decode_spec(i * 8, rng);  // no variant: the plain path
    Problem& p = spec.problem;
    p.kv_dtype = DType::kE4M3;
    p.num_qo_heads = p.num_kv_heads * 4;
    p.head_dim_qk = p.head_dim_vo = 64 << (i % 3);
    p.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
    p.o_dtype = DType::kF32;
    spec.scalars.k_scale = spec.scalars.v_scale = 1.0f;  // the scale tensors carry them
    spec.scale_min = 0x1p69f;
    spec.scale_max = 0x1p70f;
    expect_matches_reference(spec, CpuIsa::kAvx2);
  }
}

// e4m3 K rows by quads: q is multiplied by a power of two chosen from the task's largest |q|
// (quad_query_fold_exponent), so queries of any scale keep their products with the codes f32
// normals and their folded values finite: q_scale from 2^-100 to 2^120 (k_scale its inverse, so
// the scores stay near 1), at both clamps of the exponent and between. (With the fp16 QK
// reduction q_scale multiplies the f32 queries themselves; otherwise the sm_scale takes it.) A
// fixed fold of 2^60 overflows q from 2^68 and leaves products of 2^-100 queries below the
// denormals.
TEST(CpuDecodeAvx2Quads, E4m3QueriesOfAnyScale) {
  std::string why;
  if (runnable(kFmaAvx2, &why) == nullptr) GTEST_SKIP() << why;
  const KernelOverride named(kFmaAvx2);
  std::mt19937 rng(9);
  const float q_scales[] = {0x1p-100f, 0x1p-30f, 0x1p+66f, 0x1p+90f, 0x1p+120f};
  for (int i = 0; i < 10; ++i) {
    CaseSpec spec = random_decode_spec(i * 8, rng);  // no variant: the plain path
    Problem& p = spec.problem;
    p.kv_dtype = DType::kE4M3;
    p.q_dtype = DType::kBF16;
    p.o_dtype = DType::kF32;
    p.num_qo_heads = p.num_kv_heads * (i % 2 ? 3 : 4);
    p.head_dim_qk = p.head_dim_vo = 64 << (i % 3);
    p.use_fp16_qk_reduction = true;
    spec.scalars.q_scale = q_scales[i % 5];
    spec.scalars.k_scale = 1.0f / q_scales[i % 5];
    expect_matches_reference(spec, CpuIsa::kAvx2);
  }
}

#if defined(__x86_64__)
// Every K and V code of exponent 0 (values below 2^-6: here all of them) is an f32 denormal as the
// quads read it: a caller that set DAZ and FTZ (torch.set_flush_denormal(True) does) still gets
// the reference's output, and its MXCSR back as it was. (An sm_scale of 2^10 makes the scores of
// such small keys matter: with DAZ honoured they would all read 0.)
TEST(CpuDecodeAvx2Quads, E4m3DenormalCodesUnderTheCallersDaz) {
  std::string why;
  if (runnable(kFmaAvx2, &why) == nullptr) GTEST_SKIP() << why;
  const KernelOverride named(kFmaAvx2);
  std::mt19937 rng(5);
  CaseSpec spec = random_decode_spec(1, rng);
  Problem& p = spec.problem;
  p.kv_dtype = DType::kE4M3;
  p.num_qo_heads = p.num_kv_heads * 4;
  p.head_dim_qk = p.head_dim_vo = 128;
  p.sm_scale = 1024.0f;
  spec.value_range = 1.0f / 64.0f;
  constexpr unsigned kDazFtz = (1u << 6) | (1u << 15);
  const unsigned before = _mm_getcsr();
  _mm_setcsr(before | kDazFtz);
  expect_matches_reference(spec, CpuIsa::kAvx2, {.num_threads = 1});
  const unsigned after = _mm_getcsr();
  _mm_setcsr(before);
  // The control bits as the test set them (the low six are sticky exception flags).
  constexpr unsigned kFlags = 0x3F;
  EXPECT_EQ(after & ~kFlags, (before | kDazFtz) & ~kFlags);
}
#endif

}  // namespace
}  // namespace kvattn::cputest
