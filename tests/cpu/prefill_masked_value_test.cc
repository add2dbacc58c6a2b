// The numerics policy (docs/cuda.md) on the CPU backend's kernels: a key masked for a row adds
// nothing to it, even when its V holds an inf or NaN (never 0 * inf). The guard of the prefill
// kernels (src/cpu/prefill/masked_values.h) in both of its scratch layouts, then every prefill
// kernel level this machine has (f32 FMA at each ISA, bf16 dot products) and the decode kernels
// under a custom mask, on caches with inf/NaN V rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "cpu/prefill_test_util.h"
#include "kvattn/attention.h"
#include "testing/case_builder.h"

namespace kvattn::cpu::test {
namespace guard {
// The guard is plain C++ meant to be included inside a kernel's namespace; here, inside the test's.
#include "cpu/prefill/masked_values.h"
}  // namespace guard
namespace {

constexpr float kInf = INFINITY;
constexpr float kNan = NAN;

// f32 layout: 3 keys x 3 rows (padded to 4) x 2 dims, V rows 3 floats apart (the pitch's padding
// float NaN: never read as a value). Key 1's V is inf in dim 0 and NaN in dim 1; rows 0 and 2
// mask it (weight 0), row 1 sees it.
TEST(PrefillMaskedValues, F32LayoutAddsANonFiniteKeyOnlyWhereItsWeightIsNotZero) {
  constexpr int kKeys = 3, kRows = 3, kPad = 4, kDim = 2, kPitch = 3;
  std::vector<float> pt = {0.5f,  0.25f, 1.0f, 7.0f,   // key 0 (padding lane 7: ignored)
                           0.0f,  0.5f,  0.0f, 7.0f,   // key 1: seen by row 1 only
                           0.25f, 0.0f,  0.5f, 7.0f};  // key 2
  std::vector<float> vf = {1.0f, 2.0f, kNan, kInf, kNan, kNan, 3.0f, 4.0f, kNan};
  std::vector<float> ot(kDim * kPad, 0.0f);
  ASSERT_TRUE(guard::any_non_finite_rows(vf.data(), kKeys, kDim, kPitch));
  ASSERT_FALSE(guard::any_non_finite_rows(vf.data(), 1, kDim, kPitch));  // key 0 alone is finite
  ASSERT_FALSE(guard::any_non_finite_rows(vf.data() + 2 * kPitch, 1, kDim, kPitch));  // key 2
  guard::add_non_finite_values(kKeys, kRows, kPad, kDim, kPitch, pt.data(), vf.data(), ot.data());
  // The key left the tile: weights and V row 0; the finite keys are untouched.
  for (int r = 0; r < kPad; ++r) EXPECT_EQ(pt[1 * kPad + r], 0.0f) << r;
  EXPECT_EQ(vf[1 * kPitch + 0], 0.0f);
  EXPECT_EQ(vf[1 * kPitch + 1], 0.0f);
  EXPECT_EQ(pt[0], 0.5f);
  EXPECT_EQ(vf[2 * kPitch + 0], 3.0f);
  // What the tile's product then adds (every key, as accumulate_values does) plus the guard's.
  for (int j = 0; j < kKeys; ++j) {
    for (int r = 0; r < kPad; ++r) {
      for (int d = 0; d < kDim; ++d) ot[d * kPad + r] += pt[j * kPad + r] * vf[j * kPitch + d];
    }
  }
  EXPECT_EQ(ot[0 * kPad + 0], 0.5f * 1.0f + 0.25f * 3.0f);  // row 0: key 1 masked, finite
  EXPECT_EQ(ot[1 * kPad + 0], 0.5f * 2.0f + 0.25f * 4.0f);
  EXPECT_EQ(ot[0 * kPad + 2], 1.0f * 1.0f + 0.5f * 3.0f);  // row 2 likewise
  EXPECT_EQ(ot[0 * kPad + 1], kInf);                       // row 1 sees inf ...
  EXPECT_TRUE(std::isnan(ot[1 * kPad + 1]));               // ... and NaN
}

uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>(u >> 16);  // exact for the values below
}
uint32_t pair(float lo, float hi) { return bf16_bits(lo) | (uint32_t{bf16_bits(hi)} << 16); }

// The bf16 pair layout: 3 keys (pairs (0, 1) and (2, zero tail)) x 2 rows (padded to 3) x 2
// dims. Key 1 (a high half) and key 2 (a low half) have non-finite V; each is masked for one row.
TEST(PrefillMaskedValues, Bf16PairLayoutAddsANonFiniteKeyOnlyWhereItsWeightIsNotZero) {
  constexpr int kKeys = 3, kRows = 2, kPad = 3, kDim = 2;
  // P^T pairs [pair][row]: row 0 weights (0.5, 0, 0.25), row 1 weights (0.25, 0.5, 0).
  std::vector<uint32_t> pp = {pair(0.5f, 0.0f),  pair(0.25f, 0.5f), pair(1.0f, 1.0f),
                              pair(0.25f, 0.0f), pair(0.0f, 0.0f),  pair(1.0f, 1.0f)};
  // V pairs [pair][dim]: key 0 (1, 2), key 1 (inf, 3), key 2 (NaN, -inf), tail key 0.
  std::vector<uint32_t> vp = {pair(1.0f, kInf), pair(2.0f, 3.0f), pair(kNan, 0.0f),
                              pair(-kInf, 0.0f)};
  std::vector<float> ot(kDim * kPad, 0.0f);
  ASSERT_TRUE(guard::any_non_finite_pairs(vp.data(), 4));
  ASSERT_FALSE(guard::any_non_finite_pairs(&vp[1], 1));
  guard::add_non_finite_pair_values(kKeys, kRows, kPad, kDim, pp.data(), vp.data(), ot.data());
  EXPECT_EQ(vp[0], pair(1.0f, 0.0f));  // key 0 kept, key 1 zeroed
  EXPECT_EQ(vp[1], pair(2.0f, 0.0f));
  EXPECT_EQ(vp[2], 0u);  // key 2 zeroed (the tail was 0)
  EXPECT_EQ(vp[3], 0u);
  EXPECT_EQ(pp[0], pair(0.5f, 0.0f));
  EXPECT_EQ(pp[1], pair(0.25f, 0.0f));  // row 1: key 1's weight gone, key 0's kept
  EXPECT_EQ(pp[3], 0u);                 // pair (2, tail), row 0: key 2's weight gone
  // The dot products over what is left (lo * lo + hi * hi per pair), plus the guard's terms.
  const auto half = [](uint32_t w, int h) {
    return guard::bf16_bits_to_f32((w >> (16 * h)) & 0xffff);
  };
  for (int pr = 0; pr < 2; ++pr) {
    for (int r = 0; r < kPad; ++r) {
      for (int d = 0; d < kDim; ++d) {
        for (int h = 0; h < 2; ++h) {
          ot[d * kPad + r] += half(pp[pr * kPad + r], h) * half(vp[pr * kDim + d], h);
        }
      }
    }
  }
  // Row 0 sees keys 0 and 2: key 2's NaN and -inf reach it; row 1 sees keys 0 and 1.
  EXPECT_TRUE(std::isnan(ot[0 * kPad + 0]));
  EXPECT_EQ(ot[1 * kPad + 0], -kInf);
  EXPECT_EQ(ot[0 * kPad + 1], kInf);
  EXPECT_EQ(ot[1 * kPad + 1], 0.25f * 2.0f + 0.5f * 3.0f);
}

// ---- The kernels, on random cases with planted inf/NaN V rows.

// A non-finite value of the cache's dtype: +inf, -inf or NaN (e4m3 has no inf: NaN).
enum class Bad { kPosInf, kNegInf, kNan };
const char* bad_name(Bad b) {
  return b == Bad::kPosInf ? "+inf" : b == Bad::kNegInf ? "-inf" : "NaN";
}

void write_bad(DType dtype, Bad bad, std::byte* at) {
  switch (dtype) {
    case DType::kF32: {
      const float x = bad == Bad::kPosInf ? kInf : bad == Bad::kNegInf ? -kInf : kNan;
      std::memcpy(at, &x, 4);
      return;
    }
    case DType::kF16:
    case DType::kBF16: {
      const bool f16 = dtype == DType::kF16;
      const uint16_t x = bad == Bad::kPosInf   ? (f16 ? 0x7c00 : 0x7f80)
                         : bad == Bad::kNegInf ? (f16 ? 0xfc00 : 0xff80)
                                               : (f16 ? 0x7e00 : 0x7fc0);
      std::memcpy(at, &x, 2);
      return;
    }
    case DType::kE5M2:
      *at = std::byte{bad == Bad::kPosInf   ? uint8_t{0x7c}
                      : bad == Bad::kNegInf ? uint8_t{0xfc}
                                            : uint8_t{0x7e}};
      return;
    default:  // e4m3: NaN only
      *at = std::byte{0x7f};
      return;
  }
}

// Sets every dim of key j's V row (request b, every KV head) of a paged NHD case to `bad`.
void plant(testing::Case& c, const AttentionArgs& a, int b, int64_t j, Bad bad) {
  const Problem& p = c.problem();
  const TensorView& v = a.paged_v_cache;
  const int64_t page = c.kv_indices[c.kv_indptr[b] + j / p.page_size];
  const int64_t slot = j % p.page_size;
  const int64_t esize = static_cast<int64_t>(dtype_size(p.kv_dtype));
  for (int h = 0; h < p.num_kv_heads; ++h) {
    for (int d = 0; d < p.head_dim_vo; ++d) {
      const int64_t e =
          page * v.strides[0] + slot * v.strides[1] + h * v.strides[2] + d * v.strides[3];
      write_bad(p.kv_dtype, bad, static_cast<std::byte*>(v.data) + e * esize);
    }
  }
}

// Whether query i of request b sees key j (DESIGN.md §2), with the case's custom mask laid out
// as the kernels read it (per request qo_len x kv_len bits, byte-aligned per request when packed).
bool sees(const testing::Case& c, int b, int64_t i, int64_t j) {
  const Problem& p = c.problem();
  const int64_t qo = c.qo_lens()[b], kv = c.kv_lens()[b];
  const int64_t pos = i + kv - qo;
  if (p.mask_mode == MaskMode::kCausal && j > pos) return false;
  if (p.window_left >= 0 && j < pos - p.window_left) return false;
  if (p.mask_mode == MaskMode::kCustom) {
    const bool packed = c.spec().packed_custom_mask;
    int64_t begin = 0;
    for (int r = 0; r < b; ++r) {
      const int64_t bits = c.qo_lens()[r] * c.kv_lens()[r];
      begin += packed ? (bits + 7) / 8 : bits;
    }
    const int64_t bit = i * kv + j;
    const auto m = reinterpret_cast<const uint8_t*>(c.custom_mask.data());
    return packed ? ((m[begin + bit / 8] >> (bit % 8)) & 1) != 0 : m[begin + bit] != 0;
  }
  return true;
}

struct Key {
  int request;
  int64_t j;
};

// Runs `run` on the clean case, plants `bad` in the V rows of `keys` and runs again: a row that
// sees none of them is bit for bit what it was (the guard only drops terms that are 0), a row
// that sees one is non-finite in every dim.
template <class Run>
void expect_only_seeing_rows_poisoned(testing::Case& c, const std::vector<Key>& keys, Bad bad,
                                      const std::string& what, Run run) {
  const Problem& p = c.problem();
  AttentionArgs a = c.args();
  ASSERT_TRUE(run(p, a).ok()) << what;
  const std::vector<float> clean = c.out_f32();
  for (const Key& k : keys) plant(c, a, k.request, k.j, bad);
  a = c.args();
  ASSERT_TRUE(run(p, a).ok()) << what;
  const std::vector<float> out = c.out_f32();
  const int hq = p.num_qo_heads, dvo = p.head_dim_vo;
  int64_t row = 0, poisoned = 0, kept = 0;
  for (int b = 0; b < p.batch_size; ++b) {
    for (int64_t i = 0; i < c.qo_lens()[b]; ++i, ++row) {
      bool seen = false;
      for (const Key& k : keys) seen = seen || (k.request == b && sees(c, b, i, k.j));
      (seen ? poisoned : kept) += 1;
      for (int h = 0; h < hq; ++h) {
        for (int d = 0; d < dvo; ++d) {
          const int64_t e = (row * hq + h) * dvo + d;
          if (seen) {
            ASSERT_FALSE(std::isfinite(out[e]))
                << what << " b " << b << " i " << i << " h " << h << " d " << d;
          } else {
            ASSERT_EQ(out[e], clean[e])
                << what << " b " << b << " i " << i << " h " << h << " d " << d;
          }
        }
      }
    }
  }
  // Both kinds of rows occur, or the case checks less than it claims.
  EXPECT_GT(poisoned, 0) << what;
  EXPECT_GT(kept, 0) << what;
}

struct MaskCase {
  std::string name;
  void (*apply)(testing::CaseSpec& spec);
  std::vector<int64_t> bad_keys;  // of request 0 (qo 100, kv 160: queries at positions 60..159)
};

// Each bad key is masked for some rows and seen by others, inside a KV tile that masks a key.
const std::vector<MaskCase>& mask_cases() {
  static const std::vector<MaskCase> all = {
      {"causal",
       [](testing::CaseSpec& s) { s.problem.mask_mode = MaskMode::kCausal; },
       {70, 100, 159}},
      {"causal_window",
       [](testing::CaseSpec& s) {
         s.problem.mask_mode = MaskMode::kCausal;
         s.problem.window_left = 30;
       },
       {70, 100, 159}},
      {"window", [](testing::CaseSpec& s) { s.problem.window_left = 20; }, {30, 70}},
      {"custom", [](testing::CaseSpec& s) { s.problem.mask_mode = MaskMode::kCustom; }, {70}},
      {"custom_packed",
       [](testing::CaseSpec& s) {
         s.problem.mask_mode = MaskMode::kCustom;
         s.packed_custom_mask = true;
       },
       {70}},
  };
  return all;
}

TEST(PrefillMaskedValues, EveryKernelLevelKeepsAMaskedKeysNonFiniteValueOut) {
  const DType kv_types[] = {DType::kBF16, DType::kE4M3, DType::kE5M2, DType::kF16, DType::kF32};
  for (const KernelLevel& level : available_levels()) {
    LevelGuard guard_level(level);
    for (DType kv : kv_types) {
      for (const MaskCase& m : mask_cases()) {
        for (Bad bad : {Bad::kPosInf, Bad::kNegInf, Bad::kNan}) {
          if (kv == DType::kE4M3 && bad != Bad::kNan) continue;
          // A second request without planted keys; lengths off the tiles (64 tokens x 64 keys).
          testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {100, 21}, {160, 45});
          spec.problem.kv_dtype = kv;
          // FP8: per-(token, head) scales on the custom masks (the bf16-dot kernel's weights as
          // two bf16 then: hi and lo both meet the planted value).
          if (is_fp8(kv) && m.name.starts_with("custom")) {
            spec.problem.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
          }
          m.apply(spec);
          testing::Case c = testing::Case::make(spec);
          const std::string what = level.name() + " kv " + std::string(dtype_name(kv)) + " " +
                                   m.name + " v " + bad_name(bad);
          std::vector<Key> keys;
          for (int64_t j : m.bad_keys) keys.push_back({0, j});
          expect_only_seeing_rows_poisoned(
              c, keys, bad, what,
              [](const Problem& p, const AttentionArgs& a) { return run_cpu_prefill(p, a); });
        }
      }
    }
  }
}

// Per-(token, head) scales over an e5m2 cache with +inf in every dim of a key's V (request 0) and
// +inf and -inf in two keys' (request 1), keys every row sees in KV tiles no row masks (so the
// tile's products meet them, not the masked-value guard): every prefill kernel level gives inf
// and NaN exactly where the reference does (the bf16-dot kernel's weights are two bf16 each,
// split_bf16: a low part of 0 or of the other sign would make an inf NaN).
TEST(PrefillMaskedValues, PerTokenWeightsMeetInfAsTheReferenceDoes) {
  for (const KernelLevel& level : available_levels()) {
    LevelGuard guard_level(level);
    testing::CaseSpec spec = small_spec(Op::kBatchPrefillPaged, {21, 21}, {160, 150});
    Problem& p = spec.problem;
    p.kv_dtype = DType::kE5M2;
    p.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
    p.mask_mode = MaskMode::kCausal;
    p.o_dtype = DType::kF32;
    testing::Case c = testing::Case::make(spec);
    AttentionArgs fresh = c.args_with_fresh_outputs(DType::kF32);
    plant(c, fresh, 0, 30, Bad::kPosInf);  // queries at positions 139..159 (129..149): keys
    plant(c, fresh, 1, 30, Bad::kPosInf);  // 0..127 are in tiles no row masks
    plant(c, fresh, 1, 90, Bad::kNegInf);
    PlanOptions reference;
    reference.backend = "reference";
    ASSERT_TRUE(kvattn::run(p, fresh, reference).ok());
    const std::vector<float> want = c.fresh_out_f32();
    ASSERT_TRUE(run_cpu_prefill(p, c.args()).ok());
    const std::vector<float> got = c.out_f32();
    int inf = 0, nan = 0;
    for (std::size_t e = 0; e < got.size(); ++e) {
      ASSERT_EQ(std::isnan(got[e]), std::isnan(want[e])) << level.name() << " element " << e;
      ASSERT_EQ(std::isinf(got[e]), std::isinf(want[e])) << level.name() << " element " << e;
      if (std::isinf(got[e])) EXPECT_EQ(got[e], want[e]) << level.name() << " element " << e;
      inf += std::isinf(got[e]);
      nan += std::isnan(got[e]);
    }
    EXPECT_GT(inf, 0) << level.name();
    EXPECT_GT(nan, 0) << level.name();
  }
}

// Decode under a custom mask (the one mask a decode tile can hide a key with: the window and the
// request's end narrow the keys it loads): every ISA level's fp32-FMA kernels, fast dims and
// generic ones.
TEST(DecodeMaskedValues, ACustomMaskHidesANonFiniteValue) {
  const DType kv_types[] = {DType::kBF16, DType::kE4M3, DType::kF16};
  std::vector<CpuIsa> isas = {CpuIsa::kScalar};
  if (detail::cpu_features().best >= CpuIsa::kAvx2) isas.push_back(CpuIsa::kAvx2);
  if (detail::cpu_features().best >= CpuIsa::kAvx512) isas.push_back(CpuIsa::kAvx512);
  for (CpuIsa isa : isas) {
    detail::set_cpu_isa_limit(isa);
    for (int dim : {128, 40}) {
      for (DType kv : kv_types) {
        for (bool packed : {false, true}) {
          for (Bad bad : {Bad::kPosInf, Bad::kNan}) {
            if (kv == DType::kE4M3 && bad != Bad::kNan) continue;
            testing::CaseSpec spec = small_spec(Op::kBatchDecode, {}, {100, 37});
            spec.problem.num_qo_heads = 8;
            spec.problem.head_dim_qk = spec.problem.head_dim_vo = dim;
            spec.problem.kv_dtype = kv;
            spec.problem.mask_mode = MaskMode::kCustom;
            spec.packed_custom_mask = packed;
            testing::Case c = testing::Case::make(spec);
            // The first two and the last keys request 0 does not see (in its first and last
            // 32-key tiles; its rows must not change) and one key request 1 sees (its rows go
            // non-finite).
            std::vector<int64_t> hidden;
            for (int64_t j = 0; j < 100; ++j) {
              if (!sees(c, 0, 0, j)) hidden.push_back(j);
            }
            int64_t shown = 0;
            while (shown < 37 && !sees(c, 1, 0, shown)) ++shown;
            ASSERT_GT(hidden.size(), 3u);
            ASSERT_GE(hidden.back(), 96);
            ASSERT_LT(shown, 37);
            const std::vector<Key> keys = {
                {0, hidden[0]}, {0, hidden[1]}, {0, hidden.back()}, {1, shown}};
            const std::string what = std::string(cpu_isa_name(isa)) + " d " + std::to_string(dim) +
                                     " kv " + std::string(dtype_name(kv)) +
                                     (packed ? " packed" : "") + " v " + bad_name(bad);
            expect_only_seeing_rows_poisoned(c, keys, bad, what,
                                             [](const Problem& p, const AttentionArgs& a) {
                                               PlanOptions o;
                                               o.backend = "cpu";
                                               return kvattn::run(p, a, o);
                                             });
          }
        }
      }
    }
  }
  detail::clear_cpu_isa_limit();
}

}  // namespace
}  // namespace kvattn::cpu::test
