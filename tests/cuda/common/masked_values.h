// The numerics policy's masked-value check (docs/cuda.md "Numerics policy"), shared by fa2's
// and fa3's kernel-body replays: a key's V poisoned with inf / NaN must reach exactly the rows
// that see the key, never a row whose weight for it is zero (causal, window, past the request).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/common/problem_layout.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::cuda::test {

// Where element (request b, key, head, dim) of K or V lives in a case's buffers.
inline std::byte* kv_element(const Problem& p, const AttentionArgs& a, bool v, int b, int64_t key,
                             int head, int dim) {
  const bool paged = is_paged(p.op);
  const TensorView& t = paged ? (v ? a.paged_v_cache : a.paged_k_cache) : (v ? a.v : a.k);
  const paged::CacheStrides s = paged::kv_strides(p, t);
  const cuda::RequestStarts starts = cuda::request_starts(p, a);
  int64_t off;
  if (paged) {
    const int32_t* pages = static_cast<const int32_t*>(a.kv_indices.data);
    const int64_t page = pages[(starts.kv_first[b] + key / p.page_size) * a.kv_indices.strides[0]];
    off = s.offset(page, key % p.page_size, head, dim);
  } else {
    off = s.offset(0, starts.kv_first[b] + key, head, dim);
  }
  return static_cast<std::byte*>(t.data) + off * int64_t(dtype_size(t.dtype));
}
// The non-finite value of a type: inf where it has one (16-bit, e5m2), else NaN (e4m3).
inline void put_non_finite(std::byte* at, DType t) {
  switch (t) {
    case DType::kBF16: {
      const uint16_t x = num::f32_to_bf16(INFINITY);
      std::memcpy(at, &x, 2);
      break;
    }
    case DType::kF16: {
      const uint16_t x = num::f32_to_f16(INFINITY);
      std::memcpy(at, &x, 2);
      break;
    }
    case DType::kE5M2:
      *reinterpret_cast<uint8_t*>(at) = 0x7c;  // +inf
      break;
    default:
      *reinterpret_cast<uint8_t*>(at) = 0x7f;  // e4m3 NaN
      break;
  }
}
// Which keys a row sees (the reference's masks): causal bottom-right, window, kv_len.
inline bool sees(const Problem& p, int64_t qo_len, int64_t kv_len, int64_t token, int64_t key) {
  const int64_t diag = token + kv_len - qo_len;
  if (key >= kv_len) return false;
  if (p.mask_mode == MaskMode::kCausal && key > diag) return false;
  if (p.window_left >= 0 && key < diag - p.window_left) return false;
  return true;
}

// Poisons V of (request b, key, kv head 0, dim 7) and checks every row of the batch against the
// clean run (itself checked against the reference): rows that do not see the key finite and
// within twice the clean run's bound of it (both lie within the bound of the reference; the
// poisoned block's O += P V is guarded_pv's, not the tensor cores', so not the same bits), rows
// that see it non-finite in dim 7, the other dims likewise within the bound.
inline void expect_masked_v_harmless(const testing::CaseSpec& spec, int b, int64_t key,
                                     const std::string& what, const testing::RunBackend& run) {
  testing::Case clean = testing::Case::make(spec), bad = testing::Case::make(spec);
  const testing::CheckResult r = testing::check_against_reference(clean, run);
  ASSERT_TRUE(r.ok) << what << " (clean): " << r.message;
  const std::vector<float> want = clean.out_f32();
  const double tol = 2.0 * r.out.bound();
  put_non_finite(kv_element(bad.problem(), bad.args(), true, b, key, 0, 7), spec.problem.kv_dtype);
  const Status st = run(bad.problem(), bad.args());
  ASSERT_TRUE(st.ok()) << what << ": " << st.message();
  const std::vector<float> got = bad.out_f32();
  const Problem& p = spec.problem;
  const int D = p.head_dim_vo, H = p.num_qo_heads, group = p.num_qo_heads / p.num_kv_heads;
  int64_t row0 = 0;
  int bad_rows = 0, seeing_rows = 0;
  for (int r = 0; r < p.batch_size; ++r) {
    const int64_t qo = bad.qo_lens()[size_t(r)], kv = bad.kv_lens()[size_t(r)];
    for (int64_t t = 0; t < qo; ++t) {
      for (int h = 0; h < H; ++h) {
        const int64_t row = (row0 + t) * H + h;
        const bool seeing = r == b && h / group == 0 && sees(p, qo, kv, t, key);
        seeing_rows += seeing;
        for (int d = 0; d < D; ++d) {
          const float g = got[size_t(row * D + d)], w = want[size_t(row * D + d)];
          const bool ok =
              seeing && d == 7 ? !std::isfinite(g) : std::isfinite(g) && std::fabs(g - w) <= tol;
          if (!ok && bad_rows++ < 5) {
            ADD_FAILURE() << what << ": request " << r << " token " << t << " head " << h << " dim "
                          << d << (seeing ? " (sees the key)" : " (does not see it)") << ": " << g
                          << ", clean " << w;
          }
        }
      }
    }
    row0 += qo;
  }
  EXPECT_EQ(bad_rows, 0) << what;
  EXPECT_GT(seeing_rows, 0) << what << ": no row sees the poisoned key";
}

}  // namespace kvattn::cuda::test
