// The vector ISAs' e4m3 NaN code (S.1111.111) against the reference's NaN semantics: the cpu
// decode kernels read it as 480 and restore the NaNs after each tile's PV (decode_kernel.h,
// poison_e4m3_nans), or widen it to NaN (the table and AMX kernels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpu_test_util.h"
#include "decode_test_util.h"
#include "kvattn/attention.h"

namespace kvattn::cputest {
namespace {

using testing::Case;
using testing::CaseSpec;

// The NaN-code tests' problem: 2 requests of kv_lens, `group` query heads over each of 2 KV
// heads, e4m3 pages of 16, f32 output and LSE.
CaseSpec e4m3_nan_spec(int dqk, int dvo, std::vector<int64_t> kv_lens, int group = 2) {
  CaseSpec spec;
  Problem& p = spec.problem;
  p.op = Op::kBatchDecode;
  p.batch_size = 2;
  p.num_qo_heads = 2 * group;
  p.num_kv_heads = 2;
  p.head_dim_qk = dqk;
  p.head_dim_vo = dvo;
  p.page_size = 16;
  p.kv_dtype = DType::kE4M3;
  p.o_dtype = DType::kF32;
  spec.return_lse = true;
  spec.kv_lens = std::move(kv_lens);
  return spec;
}

// The e4m3 NaN code (S.1111.111) in a visible K row makes the whole row of its query heads NaN,
// in a V row the column it sits in, as in the reference; every other element stays finite.
TEST(CpuDecodeNan, E4m3NanCodesGiveTheReferencesNans) {
  const CaseSpec spec = e4m3_nan_spec(64, 64, {50, 40});
  const Problem& p = spec.problem;
  Case c = Case::make(spec);
  AttentionArgs fresh = c.args_with_fresh_outputs(DType::kF32);
  poke_paged<uint8_t>(c, fresh.paged_k_cache, 0, 7, 1, 5, 0x7F);
  poke_paged<uint8_t>(c, fresh.paged_v_cache, 1, 33, 0, 9, 0xFF);
  PlanOptions reference;
  reference.backend = "reference";
  ASSERT_TRUE(kvattn::run(p, fresh, reference).ok());
  const std::vector<float> ref_out = c.fresh_out_f32(), ref_lse = c.fresh_lse_f32();
  int nan_outputs = 0;
  // Every ISA level's default kernel, then the AMX tile kernels (named) where they run.
  std::vector<std::pair<CpuIsa, std::string_view>> runs;
  for (CpuIsa isa : isa_levels()) runs.emplace_back(isa, "");
  for (std::string_view name : {kFp8Amx, kFp8AmxEmulated}) {
    std::string why;
    if (runnable(name, &why) != nullptr) runs.emplace_back(detail::cpu_features().best, name);
  }
  for (const auto& [isa, kernel] : runs) {
    for (int64_t chunk : {int64_t{0}, int64_t{16}}) {
      IsaLimit limit(isa);
      std::optional<KernelOverride> named;
      if (!kernel.empty()) named.emplace(kernel);
      AttentionArgs args = c.args();
      ASSERT_TRUE(kvattn::run(p, args, {.backend = "cpu", .kv_chunk_size = chunk}).ok());
      const std::vector<float> out = c.out_f32(), lse = c.lse_f32();
      for (std::size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(std::isnan(out[i]), std::isnan(ref_out[i]))
            << "isa " << cpu_isa_name(isa) << " kernel " << kernel << " chunk " << chunk
            << " element " << i;
        // f32 output of an fp32-accumulated softmax average of values |v| <= 448: 1e-3 is
        // hundreds of rounding steps, far below the 2^-4 spacing of e4m3 near 1.
        if (!std::isnan(out[i])) EXPECT_NEAR(out[i], ref_out[i], 1e-3) << i;
        nan_outputs += std::isnan(out[i]);
      }
      for (std::size_t i = 0; i < lse.size(); ++i) {
        ASSERT_EQ(std::isnan(lse[i]), std::isnan(ref_lse[i])) << "lse " << i;
      }
    }
  }
  EXPECT_GT(nan_outputs, 0);
}

// The fp32-FMA kernels look for e4m3 NaN codes over a whole tile's rows at once, by 32 or 64 bytes
// and a scalar tail, or (AVX2, groups of 3 and 4, dims a multiple of 32: the quad tiles) probe
// them as they read the rows: a NaN code anywhere in a row (its first byte, one inside a 32-code
// block, the byte after a 64-byte block, its last byte), in K or V, at head dims that end in each
// of those parts, gives the reference's NaNs; a NaN code in a key the window hides gives none.
TEST(CpuDecodeNan, E4m3NanCodesAnywhereInTheRowsOfTheFmaKernels) {
  for (const std::string_view kernel : {kFmaAvx2, kFma512}) {
    std::string why;
    if (runnable(kernel, &why) == nullptr) continue;
    KernelOverride named(kernel);
    for (const auto [dqk, dvo] :
         {std::pair{40, 40}, {96, 96}, {128, 128}, {192, 128}, {256, 256}}) {
      for (const bool in_k : {true, false}) {
        const int d = in_k ? dqk : dvo;
        for (const auto [at, group] : {std::pair{0, 2}, {64, 2}, {d - 1, 2}, {0, 4}, {33, 4},
                                       {64, 4}, {d - 1, 4}}) {
          if (at >= d) continue;
          CaseSpec spec = e4m3_nan_spec(dqk, dvo, {70, 45}, group);
          Problem& p = spec.problem;
          p.window_left = 40;  // request 0 (70 keys) hides keys 0..28
          Case c = Case::make(spec);
          AttentionArgs fresh = c.args_with_fresh_outputs(DType::kF32);
          const TensorView& cache = in_k ? fresh.paged_k_cache : fresh.paged_v_cache;
          poke_paged<uint8_t>(c, cache, 0, 50, 1, at, 0xFF);  // visible: NaNs
          poke_paged<uint8_t>(c, cache, 0, 3, 0, at, 0x7F);   // hidden by the window: none
          poke_paged<uint8_t>(c, cache, 1, 44, 0, at, 0x7F);  // visible, the last key
          PlanOptions reference;
          reference.backend = "reference";
          ASSERT_TRUE(kvattn::run(p, fresh, reference).ok());
          const std::vector<float> ref_out = c.fresh_out_f32(), ref_lse = c.fresh_lse_f32();
          AttentionArgs args = c.args();
          ASSERT_TRUE(kvattn::run(p, args, {.backend = "cpu"}).ok());
          const std::vector<float> out = c.out_f32(), lse = c.lse_f32();
          int nans = 0;
          for (std::size_t i = 0; i < out.size(); ++i) {
            ASSERT_EQ(std::isnan(out[i]), std::isnan(ref_out[i]))
                << kernel << " d " << dqk << "/" << dvo << (in_k ? " K" : " V") << " byte " << at
                << " element " << i;
            if (!std::isnan(out[i])) EXPECT_NEAR(out[i], ref_out[i], 1e-3) << i;
            nans += std::isnan(out[i]);
          }
          for (std::size_t i = 0; i < lse.size(); ++i) {
            ASSERT_EQ(std::isnan(lse[i]), std::isnan(ref_lse[i])) << "lse " << i;
          }
          // K: both visible keys' heads' rows (group query heads x dvo each); V: one column of
          // them.
          EXPECT_EQ(nans, in_k ? 2 * group * dvo : 2 * group) << kernel << " d " << dqk;
        }
      }
    }
  }
}

// A NaN code in the K or V row of a key the custom mask hides gives no NaN, one in a shown key's V
// row its column's: the quad tiles probe every row of a tile (QK reads the hidden keys too), so a
// probe that finds one hands the tile to the scan, which looks at the shown keys only. Groups of 4
// (the quads on AVX2), dims 64 / 128 / 256, NHD and HND.
TEST(CpuDecodeNan, E4m3NanCodesInKeysTheCustomMaskHides) {
  for (const std::string_view kernel : {kFmaAvx2, kFma512}) {
    std::string why;
    if (runnable(kernel, &why) == nullptr) continue;
    KernelOverride named(kernel);
    for (const int d : {64, 128, 256}) {
      for (const KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
        CaseSpec spec = e4m3_nan_spec(d, d, {70, 45}, 4);
        Problem& p = spec.problem;
        p.kv_layout = layout;
        p.mask_mode = MaskMode::kCustom;
        spec.packed_custom_mask = false;
        spec.custom_mask_density = 1.0;  // every key shown but the ones hidden below
        Case c = Case::make(spec);
        // Request 0's keys 20 and 33 hidden (its mask bytes come first).
        c.custom_mask[20] = c.custom_mask[33] = std::byte{0};
        AttentionArgs fresh = c.args_with_fresh_outputs(DType::kF32);
        poke_paged<uint8_t>(c, fresh.paged_k_cache, 0, 20, 1, 5, 0x7F);  // hidden: none
        poke_paged<uint8_t>(c, fresh.paged_v_cache, 0, 33, 0, 7, 0xFF);  // hidden: none
        poke_paged<uint8_t>(c, fresh.paged_v_cache, 1, 40, 1, d - 3, 0x7F);  // shown: a column
        PlanOptions reference;
        reference.backend = "reference";
        ASSERT_TRUE(kvattn::run(p, fresh, reference).ok());
        const std::vector<float> ref_out = c.fresh_out_f32();
        AttentionArgs args = c.args();
        ASSERT_TRUE(kvattn::run(p, args, {.backend = "cpu"}).ok());
        const std::vector<float> out = c.out_f32();
        int nans = 0;
        for (std::size_t i = 0; i < out.size(); ++i) {
          ASSERT_EQ(std::isnan(out[i]), std::isnan(ref_out[i]))
              << kernel << " d " << d << " element " << i;
          if (!std::isnan(out[i])) EXPECT_NEAR(out[i], ref_out[i], 1e-3) << i;
          nans += std::isnan(out[i]);
        }
        EXPECT_EQ(nans, 4) << kernel << " d " << d;  // request 1, KV head 1's 4 query heads
      }
    }
  }
}

}  // namespace
}  // namespace kvattn::cputest
