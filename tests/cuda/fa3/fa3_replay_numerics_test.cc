// The numerics policy (docs/cuda.md) on fa3's kernel body, replayed on the SM90 emulator
// (fa3_replay.h), and FP8's P scaled by 2^8 before its e4m3 rounding (issue 21 item 4):
// - a NaN score of a visible key makes its row o = NaN and lse = NaN, also through the split-KV
//   merge, and leaves every other row as it was;
// - a masked key's inf / NaN V never meets its zero weight: rows that do not see the key (causal,
//   window, past the request's end, and the next request's keys a ragged TMA box brings in) stay
//   those of the same case with a finite V there, rows that see it get inf / NaN in that dim only;
// - FP8's P keeps the weights e4m3 would flush to zero unscaled (a case whose small weights carry
//   a quarter of the row's mass): the kernel's error stays far under the baseline's, which rounds
//   P unscaled.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/common/case_spec.h"
#include "cuda/common/masked_values.h"
#include "cuda/common/problem_layout.h"
#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/fa3_replay.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::fa3 {
namespace {

using cuda::test::expect_masked_v_harmless;
using cuda::test::kv_element;

// The GPU tests' case (cuda::kernel_case_spec: bf16 out for an FP8 query) with unit scales, which
// would only rescale what these tests probe, and the LSE returned.
testing::CaseSpec spec_for(const KernelKey& key, Op op, std::vector<int64_t> qo,
                           std::vector<int64_t> kv, int qo_heads, int kv_heads) {
  testing::CaseSpec s =
      cuda::kernel_case_spec(key, op, std::move(qo), std::move(kv), qo_heads, kv_heads);
  s.scalars = RunScalars{};
  s.return_lse = true;
  return s;
}

std::byte* q_element(const Problem& p, const AttentionArgs& a, int b, int64_t token, int head,
                     int dim) {
  const cuda::RequestStarts starts = cuda::request_starts(p, a);
  const bool single_decode = p.op == Op::kSingleDecode;
  const int64_t off = single_decode ? head * a.q.strides[0] + dim * a.q.strides[1]
                                    : (starts.q_row[b] + token) * a.q.strides[0] +
                                          head * a.q.strides[1] + dim * a.q.strides[2];
  return static_cast<std::byte*>(a.q.data) + off * int64_t(dtype_size(a.q.dtype));
}

void put_nan(std::byte* at, DType t) {
  if (dtype_size(t) == 2) {
    const uint16_t x = t == DType::kBF16 ? num::f32_to_bf16(NAN) : num::f32_to_f16(NAN);
    std::memcpy(at, &x, 2);
  } else {
    *reinterpret_cast<uint8_t*>(at) = 0x7f;  // NaN in e4m3 and e5m2
  }
}

struct Outputs {
  std::vector<float> o, lse;
};
Outputs run(testing::Case& c, const ReplayOptions& opt) {
  const Status st = run_replay(opt)(c.problem(), c.args());
  EXPECT_TRUE(st.ok()) << st.message();
  return Outputs{c.out_f32(), c.lse_f32()};
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

const KernelKey kKeys[] = {{DType::kBF16, DType::kBF16, 128, 128},
                           {DType::kE4M3, DType::kE4M3, 128, 128},
                           {DType::kE5M2, DType::kE5M2, 128, 128},
                           {DType::kF16, DType::kF16, 256, 256}};

TEST(Fa3ReplayNumerics, NanScoreRowGivesNanOutputAndLse) {
  for (const KernelKey& key : kKeys) {
    for (Op op : {Op::kBatchPrefillRagged, Op::kBatchDecode}) {
      for (int64_t chunk : {int64_t(-1), int64_t(128)}) {  // unsplit, and merged from chunks
        testing::CaseSpec spec = spec_for(key, op, {9, 4}, {300, 200}, 4, 2);
        spec.problem.mask_mode = MaskMode::kCausal;
        testing::Case clean = testing::Case::make(spec), bad = testing::Case::make(spec);
        ReplayOptions opt;
        opt.kv_chunk_size = chunk;
        const Outputs want = run(clean, opt);
        // One q element of (request 1, token 0, head 3): every score of that row is NaN.
        const int64_t token = 0, head = 3;
        put_nan(q_element(bad.problem(), bad.args(), 1, token, int(head), 5), key.q);
        const Outputs got = run(bad, opt);
        const int64_t row = (bad.qo_lens()[0] + token) * spec.problem.num_qo_heads + head;
        const int D = key.head_dim_vo;
        const std::string what = std::string(op_name(op)) + " chunk " + std::to_string(chunk) +
                                 " " + kernel_key_string(key);
        for (int64_t r = 0; r < int64_t(got.lse.size()); ++r) {
          if (r == row) {
            EXPECT_TRUE(std::isnan(got.lse[size_t(r)])) << what << ": lse " << got.lse[size_t(r)];
            for (int d = 0; d < D; ++d)
              ASSERT_TRUE(std::isnan(got.o[size_t(r * D + d)])) << what << " dim " << d;
          } else {
            ASSERT_TRUE(same_bits(got.lse[size_t(r)], want.lse[size_t(r)])) << what << " row " << r;
            for (int d = 0; d < D; ++d)
              ASSERT_TRUE(same_bits(got.o[size_t(r * D + d)], want.o[size_t(r * D + d)]))
                  << what << " row " << r << " dim " << d;
          }
        }
      }
    }
  }
}

TEST(Fa3ReplayNumerics, MaskedNonFiniteVNeverMeetsAZeroWeight) {
  for (const KernelKey& key : kKeys) {
    const std::string k = " " + kernel_key_string(key);
    // Causal inside a request: rows before the key's diagonal do not see it (ragged: TMA for
    // 16-bit; paged: cp.async).
    for (Op op : {Op::kBatchPrefillRagged, Op::kBatchPrefillPaged}) {
      testing::CaseSpec s = spec_for(key, op, {100}, {100}, 2, 1);
      s.problem.mask_mode = MaskMode::kCausal;
      expect_masked_v_harmless(s, 0, 40, std::string(op_name(op)) + " causal" + k, run_replay({}));
      // A window: rows past key + window + 1 no longer see it.
      s.problem.window_left = 20;
      expect_masked_v_harmless(s, 0, 40, std::string(op_name(op)) + " causal window" + k,
                               run_replay({}));
    }
    // The next request's first key, which the box of a short ragged request brings in (16-bit:
    // TMA reads 128 keys from the request's start).
    testing::CaseSpec s = spec_for(key, Op::kBatchPrefillRagged, {5, 5}, {40, 100}, 2, 1);
    expect_masked_v_harmless(s, 1, 0, "next request's key" + k, run_replay({}));
  }
}

// FP8: one key of score 0 (V = 0) and 1023 of score -8 (V = 1): each small weight e^-8 =
// 3.4e-4 is under half e4m3's smallest subnormal (2^-10), so rounded unscaled (the baseline) it
// vanishes and the output loses the quarter of the mass those keys carry; scaled by 2^8 first it
// is 0.086, rounded by 0.2 %.
TEST(Fa3ReplayNumerics, Fp8PScaledBeforeItsRounding) {
  for (DType kv : {DType::kE4M3, DType::kE5M2}) {
    const KernelKey key{DType::kE4M3, kv, 128, 128};
    testing::CaseSpec s = spec_for(key, Op::kBatchDecode, {1}, {1024}, 1, 1);
    s.problem.sm_scale = 1.0f;
    testing::Case c = testing::Case::make(s);
    const Problem& p = c.problem();
    AttentionArgs a = c.args();
    const auto put = [&](std::byte* at, DType t, float x) {
      *reinterpret_cast<uint8_t*>(at) =
          t == DType::kE4M3 ? num::f32_to_e4m3(x) : num::f32_to_e5m2(x);
    };
    for (int d = 0; d < p.head_dim_qk; ++d)
      put(q_element(p, a, 0, 0, 0, d), key.q, d == 0 ? 1.0f : 0.0f);
    for (int64_t j = 0; j < 1024; ++j) {
      for (int d = 0; d < p.head_dim_qk; ++d) {
        put(kv_element(p, a, false, 0, j, 0, d), kv, d == 0 && j > 0 ? -8.0f : 0.0f);
      }
      for (int d = 0; d < p.head_dim_vo; ++d)
        put(kv_element(p, a, true, 0, j, 0, d), kv, j > 0 ? 1.0f : 0.0f);
    }
    ReplayOptions o;
    o.kv_chunk_size = -1;  // one chunk: the running max is the row's from the first block on
    const testing::CheckResult r = testing::check_against_reference(c, run_replay(o));
    EXPECT_TRUE(r.ok) << r.message;
    EXPECT_GT(r.out.baseline_err, 0.1) << "the case must make unscaled rounding lose the weights";
    EXPECT_LT(r.out.max_err, 0.1 * r.out.baseline_err)
        << kernel_key_string(key) << ": P scaled by 2^8 keeps the small weights: " << r.message;
  }
}

// FP8's O over a long KV (issue 21 item 4): the FP8 wgmma adds in reduced precision (the
// emulator's model: 13 bits below the largest term, truncated; sm90_emulator.h), so an O carried
// through ~940 blocks' wgmmas drifts toward zero by a few of its own ulps per block: V values
// around 1 and near-uniform weights make O about 1 and the drift systematic (the emulator put it
// 89 % low at 120k keys before pv_promoted: once O's accumulator is 2^13 times a product, the
// products vanish). With each block's P V in a fresh accumulator added in f32, O holds the
// tolerance of testing/tolerance.h. One request, one head, decode: 128 (CI) or 938 blocks of 128
// keys on one CTA.
TEST(Fa3ReplayNumerics, Fp8OutputAccurateOverALongKv) {
  // CI: 16k keys (without the promotion the output is already far over its bound there: 0.21
  // against 0.013 at 15k keys); KVATTN_FA3_REPLAY_FULL=1: 120k keys (0.89 against 0.010).
  const char* full = std::getenv("KVATTN_FA3_REPLAY_FULL");
  const int64_t kKeys = full != nullptr && std::string(full) == "1" ? 120000 : 16384;
  const KernelKey key{DType::kE4M3, DType::kE4M3, 128, 128};
  testing::CaseSpec s = spec_for(key, Op::kBatchDecode, {1}, {kKeys}, 1, 1);
  s.extra_pages = 0;
  s.value_range = 0.5f;  // scores in about +-0.1: every weight within 10 % of the largest
  testing::Case c = testing::Case::make(s);
  // Every slot of the V cache in [0.75, 1.25] (e4m3): O is about 1.
  const TensorView& v = c.args().paged_v_cache;
  ASSERT_EQ(v.rank, 4);
  uint64_t h = 12345;
  for (int64_t i0 = 0; i0 < v.shape[0]; ++i0)
    for (int64_t i1 = 0; i1 < v.shape[1]; ++i1)
      for (int64_t i2 = 0; i2 < v.shape[2]; ++i2)
        for (int64_t i3 = 0; i3 < v.shape[3]; ++i3) {
          h = h * 6364136223846793005ull + 1442695040888963407ull;
          const float x = 0.75f + 0.5f * float(h >> 40) / float(1 << 24);
          static_cast<uint8_t*>(v.data)[i0 * v.strides[0] + i1 * v.strides[1] + i2 * v.strides[2] +
                                        i3 * v.strides[3]] = num::f32_to_e4m3(x);
        }
  ReplayOptions o;
  o.kv_chunk_size = -1;  // one chunk: the whole KV through one O accumulator
  const testing::CheckResult r = testing::check_against_reference(c, run_replay(o));
  EXPECT_TRUE(r.ok) << r.message;
  RecordProperty("figures", std::to_string(kKeys) + " keys: " + r.message);
}

}  // namespace
}  // namespace kvattn::fa3
