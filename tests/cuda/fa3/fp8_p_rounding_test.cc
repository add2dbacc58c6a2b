// The tolerance model of FP8 queries (issue 21, item 4): testing/baseline.cc rounds P to e4m3 for
// an e4m3 or e5m2 query, as fa3's FP8 P.V wgmma consumes it (FlashAttention-3's way). A model of
// that kernel - online softmax over 128-key blocks in fp32, P = exp(s - running max) rounded to
// e4m3, O accumulated in fp32 - must pass check_against_reference; with P kept in fp32 in the
// baseline (before the fix) the bound was 2x (bf16 out) to ~1000x (f32 out) too tight for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/element_io.h"
#include "reference/kv_reader.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::testing {
namespace {

// fa3's FP8 consumer, as a model on the host: P scaled by p_scale before its e4m3 rounding (fa3
// scales by 2^8, kFp8PScale; 1 is the looser kernel the baseline models).
Status fp8_kernel_model(const Problem& p, const AttentionArgs& args, float p_scale) {
  const ref::AttentionRows rows(p, args);
  const float scale = p.effective_sm_scale();
  constexpr int64_t kBlock = 128;
  const float inf = std::numeric_limits<float>::infinity();
  for (int b = 0; b < rows.batch_size(); ++b) {
    const int64_t qo_len = rows.qo_len(b), kv_len = rows.kv_len(b);
    for (int h = 0; h < p.num_qo_heads; ++h) {
      const int kvh = h / p.group_size();
      for (int64_t i = 0; i < qo_len; ++i) {
        std::vector<float> o(size_t(p.head_dim_vo), 0.0f);
        float m = -inf, l = 0.0f;
        for (int64_t j0 = 0; j0 < kv_len; j0 += kBlock) {
          const int64_t j1 = std::min(kv_len, j0 + kBlock);
          std::vector<float> s(size_t(j1 - j0));
          float block_max = -inf;
          for (int64_t j = j0; j < j1; ++j) {
            float dot = 0.0f;
            for (int d = 0; d < p.head_dim_qk; ++d) {
              dot += float(rows.q(b, i, h, d)) * rows.q_scale() * float(rows.k(b, j, kvh, d)) *
                     float(rows.k_scale(b, j, kvh));
            }
            s[size_t(j - j0)] = dot * scale;
            block_max = std::max(block_max, dot * scale);
          }
          const float m_new = std::max(m, block_max);
          const float alpha = std::exp(m - m_new);
          l *= alpha;
          for (float& x : o) x *= alpha;
          for (int64_t j = j0; j < j1; ++j) {
            const float prob = std::exp(s[size_t(j - j0)] - m_new);
            l += prob;
            const auto p8 = float(ref::round_to_dtype(prob * p_scale, DType::kE4M3)) / p_scale;
            for (int d = 0; d < p.head_dim_vo; ++d) {
              o[size_t(d)] += p8 * float(rows.v(b, j, kvh, d)) * float(rows.v_scale(b, j, kvh));
            }
          }
          m = m_new;
        }
        for (int d = 0; d < p.head_dim_vo; ++d) rows.store_out(b, i, h, d, o[size_t(d)] / l);
        if (rows.returns_lse()) rows.store_lse(b, i, h, m + std::log(l));
      }
    }
  }
  return Status::Ok();
}

CaseSpec fp8_spec(DType q, DType o, int64_t kv_len) {
  CaseSpec s;
  Problem& p = s.problem;
  p.op = Op::kSinglePrefill;
  p.batch_size = 1;
  p.num_qo_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim_qk = p.head_dim_vo = 128;
  p.q_dtype = q;
  p.kv_dtype = q;
  p.o_dtype = o;
  s.return_lse = true;
  s.qo_lens = {16};
  s.kv_lens = {kv_len};
  s.value_range = 4.0f;  // a peaked softmax: many small P that e4m3 rounds coarsely
  return s;
}

TEST(Fp8PRounding, AKernelRoundingPToE4m3PassesForBothFp8QueryTypes) {
  for (DType q : {DType::kE4M3, DType::kE5M2}) {
    for (DType o : {DType::kF32, DType::kBF16}) {
      for (int64_t kv_len : {int64_t(200), int64_t(1000)}) {
        for (float p_scale : {1.0f, 256.0f}) {
          Case c = Case::make(fp8_spec(q, o, kv_len));
          const CheckResult r =
              check_against_reference(c, [&](const Problem& p, const AttentionArgs& a) {
                return fp8_kernel_model(p, a, p_scale);
              });
          EXPECT_TRUE(r.ok) << "q " << dtype_name(q) << ", out " << dtype_name(o) << ", "
                            << kv_len << " keys, P scaled by " << p_scale << ": " << r.message;
        }
      }
    }
  }
}

// Why fa3 scales P by 2^8 before rounding it: a row with one dominant key (an "attention sink")
// over many others whose probabilities, relative to the row's maximum, sit below e4m3's smallest
// subnormal (2^-9): unscaled rounding flushes them all, though together they hold most of the
// row's mass; scaled by 2^8 they survive. Every query row is q[0]; key 0 is q[0] / 2 (score ~9.5
// above the others' ~N(0, 1.7): P ~ 2^-14 each, 30000 of them ~90% of the mass).
TEST(Fp8PRounding, ScalingPBeforeRoundingLosesLess) {
  double err[2] = {0, 0};
  int i = 0;
  for (float p_scale : {1.0f, 256.0f}) {
    CaseSpec spec = fp8_spec(DType::kE4M3, DType::kF32, 30000);
    spec.qo_lens = {4};
    spec.value_range = 2.25f;
    Case c = Case::make(spec);
    const AttentionArgs a = c.args();
    const int64_t rows = a.q.shape[0] * a.q.shape[1], dim = a.q.shape[2];
    for (int64_t r = 1; r < rows; ++r) {
      for (int64_t d = 0; d < dim; ++d) {
        ref::store_element(a.q.data, DType::kE4M3, r * dim + d,
                           ref::load_element(a.q.data, DType::kE4M3, d));
      }
    }
    for (int64_t d = 0; d < dim; ++d) {
      ref::store_element(a.k.data, DType::kE4M3, d,
                         0.5 * ref::load_element(a.q.data, DType::kE4M3, d));
    }
    const CheckResult r = check_against_reference(c, [&](const Problem& p, const AttentionArgs& x) {
      return fp8_kernel_model(p, x, p_scale);
    });
    EXPECT_TRUE(r.ok) << "P scaled by " << p_scale << ": " << r.message;
    err[i++] = r.out.max_err;
  }
  EXPECT_LT(err[1], 0.25 * err[0]) << "unscaled " << err[0] << ", scaled by 2^8 " << err[1];
}

// The bound is not loose to the point of passing anything: a kernel that halves one output
// element in ten still fails.
TEST(Fp8PRounding, TheBoundStillCatchesAWrongKernel) {
  Case c = Case::make(fp8_spec(DType::kE4M3, DType::kF32, 1000));
  const RunBackend wrong = [](const Problem& p, const AttentionArgs& args) {
    Status st = fp8_kernel_model(p, args, 256.0f);
    // corrupt: halve every tenth output element
    float* out = static_cast<float*>(args.out.data);
    const int64_t n = args.out.shape[0] * args.out.shape[1] * args.out.shape[2];
    for (int64_t e = 0; e < n; e += 10) out[e] *= 0.5f;
    return st;
  };
  const CheckResult r = check_against_reference(c, wrong);
  EXPECT_FALSE(r.ok) << r.message;
}

}  // namespace
}  // namespace kvattn::testing
