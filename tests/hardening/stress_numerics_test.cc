// Numerics under stress (issue 6), on every available backend against exact answers: logits of
// +-1e4 (exp must not overflow or underflow to 0/0), rows that see no key (o = 0, lse = -inf),
// kv_len 0, and FP8 saturation at +-448 (e4m3) and +-57344 (e5m2) when appending to the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "hardening/backends_under_test.h"
#include "hardening/fixtures.h"
#include "hardening/stress_util.h"
#include "kvattn/attention.h"
#include "testing/baseline.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::hardening {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr Op kOps[] = {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode,
                       Op::kBatchPrefillPaged, Op::kBatchPrefillRagged};

// Runs `backend`; a backend whose capability excludes the problem says so on stderr and is not
// counted (false). Any other failure fails the test.
bool run_on(const std::string& backend, const Problem& p, const AttentionArgs& a) {
  PlanOptions opt;
  opt.backend = backend;
  Status s = kvattn::run(p, a, opt);
  if (s.code() == ErrorCode::kNotSupported) {
    std::cerr << "[stress] " << backend << " does not run " << p.to_string() << ": " << s.message()
              << '\n';
    return false;
  }
  EXPECT_TRUE(s.ok()) << backend << ": " << s.to_string();
  return s.ok();
}

// f32 ulps at the scale of `x`: how close an f32 result can be to an exact value.
double f32_ulps(double x, double n) { return n * std::ldexp(std::max(1.0, std::fabs(x)), -23); }

// ---- logits of +-1e4 ----

// The tolerance rule of testing/tolerance.h, widened for scores of large magnitude: a score held
// in f32 is only known to an ulp of itself, and a kernel that folds sm_scale * log2(e) into exp2
// rounds once more, so each score may move by delta = 2^-23 max|s| (1.2e-3 at 1e4). As with the
// fp16-reduction widening there, that moves the LSE by <= delta and the output by
// <= 2 delta max|v|. (The baseline does not show it: these scores are exact in f32.)
testing::CheckResult check_with_large_scores(testing::Case& c, const std::string& backend,
                                             double max_abs_score) {
  const Problem& p = c.problem();
  const int64_t total_qo = p.op == Op::kSingleDecode ? 1 : c.total_qo();
  const int64_t rows = total_qo * p.num_qo_heads;
  Problem ref_problem = p;
  ref_problem.o_dtype = DType::kF32;
  AttentionArgs ref_args = c.args_with_fresh_outputs(DType::kF32);
  PlanOptions ref_options;
  ref_options.backend = "reference";
  testing::CheckResult failed;
  Status st = kvattn::run(ref_problem, ref_args, ref_options);
  if (!st.ok()) {
    failed.message = "reference: " + st.to_string();
    return failed;
  }
  const std::vector<float> ref_out = c.fresh_out_f32(), ref_lse = c.fresh_lse_f32();
  AttentionArgs base_args = c.args_with_fresh_outputs(p.o_dtype);
  st = testing::baseline_attention(p, base_args);
  if (!st.ok()) {
    failed.message = "baseline: " + st.to_string();
    return failed;
  }
  const std::vector<float> base_out = c.fresh_out_f32(), base_lse = c.fresh_lse_f32();
  AttentionArgs args = c.args();
  PlanOptions options;
  options.backend = backend;
  st = kvattn::run(p, args, options);
  if (!st.ok()) {
    failed.message = backend + ": " + st.to_string();
    return failed;
  }
  double max_v = 0;
  const TensorView& v = is_paged(p.op) ? args.paged_v_cache : args.v;
  for (float x : testing::view_to_f32(v)) {
    if (std::isfinite(x)) max_v = std::max(max_v, static_cast<double>(std::fabs(x)));
  }
  const double delta = std::ldexp(max_abs_score, -23);
  return testing::compare_with_reference(p, rows, ref_out, ref_lse, base_out, base_lse, c.out_f32(),
                                         c.lse_f32(), {2 * delta * max_v, delta});
}

struct LogitParam {
  Op op;
  DType dtype;
  bool high;       // logits around +1e4, else all around -1e4
  float soft_cap;  // 0: none
};

class StressLogits : public ::testing::TestWithParam<LogitParam> {};

TEST_P(StressLogits, MatchTheExactSoftmaxWithoutOverflow) {
  const LogitParam& lp = GetParam();
  testing::CaseSpec spec;
  Problem& p = spec.problem;
  p.op = lp.op;
  p.batch_size = 1;
  p.num_qo_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim_qk = p.head_dim_vo = 4;
  p.page_size = 2;
  p.q_dtype = p.kv_dtype = lp.dtype;
  p.o_dtype = DType::kF32;
  p.sm_scale = 1.0f;
  p.logits_soft_cap = lp.soft_cap;
  spec.return_lse = true;
  spec.kv_lens = {5};
  spec.qo_lens = {2};
  // q = (100, 1, 0, 0): logit_j = 100 k_j[0] + k_j[1]. Every value is exact in bf16.
  const float high[5][2] = {{100, 0}, {-100, 0}, {100, -1}, {0, 0}, {-50, 0}};
  const float low[5][2] = {{-100, 0}, {-100, -1}, {-100, -3}, {-100, -2}, {-100, -5}};
  const auto& keys = lp.high ? high : low;
  std::vector<double> logits;
  std::vector<std::vector<double>> values;
  for (int j = 0; j < 5; ++j) {
    double s = 100.0 * keys[j][0] + keys[j][1];
    if (lp.soft_cap > 0) s = lp.soft_cap * std::tanh(s / lp.soft_cap);
    logits.push_back(s);
    values.push_back({j + 1.0, -0.5 * (j + 1), 0.25 * j, 1.0});
  }
  const ExactSoftmax exact = exact_softmax(logits, values);
  double max_abs_logit = 0;
  for (double l : logits) max_abs_logit = std::max(max_abs_logit, std::fabs(l));

  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    testing::Case c = testing::Case::make(spec);
    AttentionArgs a = c.args();
    const int64_t rows = lp.op == Op::kSingleDecode ? 1 : c.total_qo();
    for (int64_t r = 0; r < rows; ++r) {
      for (int h = 0; h < 2; ++h) {
        const float q[4] = {100, 1, 0, 0};
        for (int d = 0; d < 4; ++d) set_q(p, a, r, h, d, q[d]);
      }
    }
    for (int j = 0; j < 5; ++j) {
      for (int d = 0; d < 4; ++d) {
        set_kv(p, a, false, 0, j, 0, d, d < 2 ? keys[j][d] : 0.0f);
        set_kv(p, a, true, 0, j, 0, d, static_cast<float>(values[j][d]));
      }
    }
    if (backend != "reference") {
      // Other backends: the precision rule of testing/tolerance.h against the reference, which
      // itself is held to the exact answer below.
      const testing::CheckResult r = check_with_large_scores(c, backend, max_abs_logit);
      if (r.message.find("not_supported:") != std::string::npos) {
        std::cerr << "[stress] " << backend << ": " << r.message << '\n';
        continue;
      }
      EXPECT_TRUE(r.ok) << r.message;
      continue;
    }
    if (!run_on(backend, p, a)) continue;
    const std::vector<float> out = testing::view_to_f32(a.out);
    const std::vector<float> lse = testing::view_to_f32(a.lse);
    ASSERT_EQ(out.size(), static_cast<size_t>(rows * 2 * 4));
    for (int64_t row = 0; row < rows * 2; ++row) {
      EXPECT_NEAR(lse[row], exact.lse, f32_ulps(exact.lse, 4)) << "row " << row;
      for (int d = 0; d < 4; ++d) {
        EXPECT_NEAR(out[row * 4 + d], exact.out[d], f32_ulps(exact.out[d], 4))
            << "row " << row << " d " << d;
      }
    }
  }
}

std::vector<LogitParam> logit_params() {
  std::vector<LogitParam> params;
  for (Op op : kOps) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (bool high : {true, false}) {
        for (float cap : {0.0f, 50.0f}) params.push_back({op, dt, high, cap});
      }
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Stress, StressLogits, ::testing::ValuesIn(logit_params()),
                         [](const ::testing::TestParamInfo<LogitParam>& info) {
                           const LogitParam& p = info.param;
                           return std::string(op_name(p.op)) + "_" +
                                  std::string(dtype_name(p.dtype)) +
                                  (p.high ? "_plus1e4" : "_minus1e4") +
                                  (p.soft_cap > 0 ? "_softcap" : "");
                         });

// ---- rows that see no key, and kv_len 0 ----

struct EmptyRowsCase {
  std::string name;
  Op op;
  MaskMode mask;
  std::vector<int64_t> qo_lens, kv_lens;
  std::vector<int64_t> empty_rows;  // query rows over the batch that see no key
  // Custom mask: (request, row) pairs whose mask row is cleared.
  std::vector<std::pair<int, int64_t>> cleared_mask_rows = {};
  KVLayout layout = KVLayout::kNHD;
};

std::vector<EmptyRowsCase> empty_rows_cases() {
  std::vector<EmptyRowsCase> cases = {
      // Causal, bottom-right: with qo_len 5 > kv_len 2, rows 0..2 see j <= i - 3: nothing.
      {"causal_qo_past_kv_paged",
       Op::kBatchPrefillPaged,
       MaskMode::kCausal,
       {5, 3},
       {2, 0},
       {0, 1, 2, 5, 6, 7}},
      {"causal_qo_past_kv_ragged",
       Op::kBatchPrefillRagged,
       MaskMode::kCausal,
       {5, 3},
       {2, 0},
       {0, 1, 2, 5, 6, 7}},
      {"causal_qo_past_kv_single", Op::kSinglePrefill, MaskMode::kCausal, {4}, {1}, {0, 1, 2}},
      {"causal_qo_past_kv_single_hnd",
       Op::kSinglePrefill,
       MaskMode::kCausal,
       {4},
       {1},
       {0, 1, 2},
       {},
       KVLayout::kHND},
      {"custom_mask_cleared_rows",
       Op::kBatchPrefillPaged,
       MaskMode::kCustom,
       {3, 2},
       {4, 3},
       {1, 3},
       {{0, 1}, {1, 0}}},
      {"decode_request_without_keys", Op::kBatchDecode, MaskMode::kNone, {1, 1, 1}, {3, 0, 4}, {1}},
  };
  // kv_len 0 everywhere: every row sees nothing.
  for (Op op : kOps) {
    for (MaskMode mask : {MaskMode::kNone, MaskMode::kCausal}) {
      EmptyRowsCase c{
          "kv_len_0_" + std::string(op_name(op)) + "_" + std::string(mask_mode_name(mask)),
          op,
          mask,
          {},
          {},
          {}};
      const bool batch = is_batch(op);
      c.kv_lens = batch ? std::vector<int64_t>{0, 0} : std::vector<int64_t>{0};
      c.qo_lens = is_decode(op) ? std::vector<int64_t>(c.kv_lens.size(), 1)
                                : (batch ? std::vector<int64_t>{2, 1} : std::vector<int64_t>{3});
      int64_t rows = 0;
      for (int64_t n : c.qo_lens) rows += n;
      for (int64_t r = 0; r < rows; ++r) c.empty_rows.push_back(r);
      cases.push_back(c);
    }
  }
  return cases;
}

class StressEmptyRows : public ::testing::TestWithParam<EmptyRowsCase> {};

TEST_P(StressEmptyRows, GiveZeroAndMinusInfinityNeverNaN) {
  const EmptyRowsCase& ec = GetParam();
  testing::CaseSpec spec;
  Problem& p = spec.problem;
  p.op = ec.op;
  p.batch_size = static_cast<int>(ec.kv_lens.size());
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim_qk = 8;
  p.head_dim_vo = 6;
  p.page_size = 2;
  p.kv_layout = ec.layout;
  p.q_dtype = p.kv_dtype = DType::kBF16;
  p.o_dtype = DType::kF32;
  p.mask_mode = ec.mask;
  spec.return_lse = true;
  spec.kv_lens = ec.kv_lens;
  spec.qo_lens = ec.qo_lens;
  spec.custom_mask_density = 1.0;  // every other row keeps all of its keys
  const int64_t rows = p.op == Op::kSingleDecode ? 1 : [&] {
    int64_t n = 0;
    for (int64_t q : ec.qo_lens) n += q;
    return n;
  }();
  const int64_t hq = p.num_qo_heads, dvo = p.head_dim_vo;
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    testing::Case c = testing::Case::make(spec);
    // Clear whole rows of the (unpacked) custom mask: request b's rows start after the
    // qo_len x kv_len entries of the requests before it.
    for (const auto& [b, row] : ec.cleared_mask_rows) {
      int64_t begin = 0;
      for (int r = 0; r < b; ++r) begin += ec.qo_lens[r] * ec.kv_lens[r];
      begin += row * ec.kv_lens[b];
      for (int64_t j = 0; j < ec.kv_lens[b]; ++j) c.custom_mask[begin + j] = std::byte{0};
    }
    AttentionArgs a = c.args();  // outputs start as NaN
    if (!run_on(backend, p, a)) continue;
    const std::vector<float> out = testing::view_to_f32(a.out);
    const std::vector<float> lse = testing::view_to_f32(a.lse);
    for (int64_t r = 0; r < rows; ++r) {
      const bool empty =
          std::find(ec.empty_rows.begin(), ec.empty_rows.end(), r) != ec.empty_rows.end();
      for (int64_t h = 0; h < hq; ++h) {
        const float l = lse[r * hq + h];
        if (empty) {
          EXPECT_EQ(l, -kInf) << "row " << r << " head " << h;
        } else {
          EXPECT_TRUE(std::isfinite(l)) << "row " << r << " head " << h << ": " << l;
        }
        for (int64_t d = 0; d < dvo; ++d) {
          const float o = out[(r * hq + h) * dvo + d];
          if (empty) {
            EXPECT_EQ(o, 0.0f) << "row " << r << " head " << h << " d " << d;
          } else {
            EXPECT_TRUE(std::isfinite(o)) << "row " << r << " head " << h << " d " << d;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stress, StressEmptyRows, ::testing::ValuesIn(empty_rows_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- FP8 saturation when appending ----

struct Fp8Expectation {
  float input;
  float e4m3;  // the value stored, decoded
  float e5m2;
};

// Saturating (satfinite) quantization: past the largest finite value, and +-inf, become +-max.
// Halfway cases round to even (480 is halfway between e5m2's 448 and 512; 512 is even).
constexpr Fp8Expectation kFp8Cases[] = {
    {0.0f, 0.0f, 0.0f},           {1.0f, 1.0f, 1.0f},           {-2.0f, -2.0f, -2.0f},
    {0.5f, 0.5f, 0.5f},           {448.0f, 448.0f, 448.0f},     {-448.0f, -448.0f, -448.0f},
    {449.0f, 448.0f, 448.0f},     {464.0f, 448.0f, 448.0f},     {480.0f, 448.0f, 512.0f},
    {500.0f, 448.0f, 512.0f},     {-1e6f, -448.0f, -57344.0f},  {1e30f, 448.0f, 57344.0f},
    {kInf, 448.0f, 57344.0f},     {-kInf, -448.0f, -57344.0f},  {57344.0f, 448.0f, 57344.0f},
    {61440.0f, 448.0f, 57344.0f}, {65536.0f, 448.0f, 57344.0f}, {-57344.0f, -448.0f, -57344.0f},
};

float decode_fp8(uint8_t code, DType dtype) {
  return dtype == DType::kE4M3 ? num::e4m3_to_f32(code) : num::e5m2_to_f32(code);
}

class StressFp8Append : public ::testing::TestWithParam<std::tuple<DType, KVLayout, float>> {};

TEST_P(StressFp8Append, SaturatesAtTheFiniteRange) {
  const auto [dtype, layout, scale] = GetParam();
  for (const std::string& backend : backends_under_test()) {
    SCOPED_TRACE("backend " + backend);
    AppendFixture f(dtype, layout);
    f.cache.k_scale = f.cache.v_scale = scale;
    // Token i, head h, dim d takes case (i * 16 + h * 8 + d) mod N; V takes the next one.
    constexpr int kCases = static_cast<int>(std::size(kFp8Cases));
    auto case_of = [](int64_t i, int64_t h, int64_t d, bool value_tensor) {
      return static_cast<int>((i * 16 + h * 8 + d + (value_tensor ? 1 : 0)) % kCases);
    };
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t d = 0; d < 8; ++d) {
          // real = stored x scale, so the input is the expectation's input times the scale.
          f.append_k[(i * 2 + h) * 8 + d] = kFp8Cases[case_of(i, h, d, false)].input * scale;
          f.append_v[(i * 2 + h) * 8 + d] = kFp8Cases[case_of(i, h, d, true)].input * scale;
        }
      }
    }
    OpOptions opt;
    opt.backend = backend;
    Status s = kvattn::append_paged_kv_cache(f.tappend_k, f.tappend_v, f.tbatch_indices,
                                             f.tpositions, f.cache, opt);
    if (s.code() == ErrorCode::kNotSupported) {
      std::cerr << "[stress] " << backend << ": " << s.message() << '\n';
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.to_string();
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t b = f.batch_indices[i], pos = f.positions[i];
      const int64_t page = f.kv_indices[f.kv_indptr[b] + pos / 4], slot = pos % 4;
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t d = 0; d < 8; ++d) {
          const int64_t at = layout == KVLayout::kNHD ? ((page * 4 + slot) * 2 + h) * 8 + d
                                                      : ((page * 2 + h) * 4 + slot) * 8 + d;
          for (bool value_tensor : {false, true}) {
            const Fp8Expectation& e = kFp8Cases[case_of(i, h, d, value_tensor)];
            const uint8_t code = value_tensor ? f.v_cache[at] : f.k_cache[at];
            EXPECT_EQ(decode_fp8(code, dtype), dtype == DType::kE4M3 ? e.e4m3 : e.e5m2)
                << (value_tensor ? "v" : "k") << " input " << e.input * scale << " code 0x"
                << std::hex << int{code};
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stress, StressFp8Append,
                         ::testing::Combine(::testing::Values(DType::kE4M3, DType::kE5M2),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND),
                                            ::testing::Values(1.0f, 2.0f)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  std::string(kv_layout_name(std::get<1>(info.param))) +
                                  (std::get<2>(info.param) == 1.0f ? "_scale1" : "_scale2");
                         });

TEST(StressFp8Append, NaNStaysNaN) {
  for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
    for (const std::string& backend : backends_under_test()) {
      AppendFixture f(dtype);
      for (float& x : f.append_k) x = std::numeric_limits<float>::quiet_NaN();
      OpOptions opt;
      opt.backend = backend;
      Status s = kvattn::append_paged_kv_cache(f.tappend_k, f.tappend_v, f.tbatch_indices,
                                               f.tpositions, f.cache, opt);
      if (s.code() == ErrorCode::kNotSupported) continue;
      ASSERT_TRUE(s.ok()) << backend << ": " << s.to_string();
      // Request 0, position 3: page kv_indices[0], slot 3.
      const int64_t at = (f.kv_indices[0] * 4 + 3) * 2 * 8;
      EXPECT_TRUE(std::isnan(decode_fp8(f.k_cache[at], dtype))) << backend;
    }
  }
}

}  // namespace
}  // namespace kvattn::hardening
