// Helpers for the reference tests: small dense problems with f32 buffers filled by hand, and a
// batch of requests held contiguously per request that the tests lay out in every storage form
// themselves (ragged, paged NHD/HND, shuffled pages, combined caches) without going through the
// reference's own readers.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvattn/attention.h"
#include "testing/case_builder.h"

namespace kvattn::reftest {

inline Status run_reference(const Problem& p, const AttentionArgs& args) {
  PlanOptions options;
  options.backend = "reference";
  return kvattn::run(p, args, options);
}

// One request of single_prefill (or single_decode when qo_len is 1 and decode is asked) in f32,
// NHD, filled by the test.
struct Dense {
  Problem p;
  int64_t qo_len = 1, kv_len = 1;
  std::vector<float> q, k, v, out, lse, alibi_slopes;
  // Given when non-empty: sinks [Hq]; k/v_scale [Hk]; k/v_scale_cache [kv, Hk].
  std::vector<float> sinks, k_scale, v_scale, k_scale_cache, v_scale_cache;
  // k and v in p.kv_dtype when it is not f32 (converted from k, v by args()).
  std::vector<std::byte> k_bytes, v_bytes;
  std::vector<uint8_t> mask;
  bool mask_packed = false;
  // The run values: scales, the LSE base, and whether the lse is asked for.
  RunScalars scalars;
  bool return_lse = true;

  Dense(int64_t qo, int64_t kv, int hq, int hk, int dqk, int dvo, bool decode = false)
      : qo_len(qo), kv_len(kv) {
    p.op = decode ? Op::kSingleDecode : Op::kSinglePrefill;
    p.batch_size = 1;
    p.num_qo_heads = hq;
    p.num_kv_heads = hk;
    p.head_dim_qk = dqk;
    p.head_dim_vo = dvo;
    p.q_dtype = p.kv_dtype = p.o_dtype = DType::kF32;
    q.assign(qo * hq * dqk, 0.0f);
    k.assign(kv * hk * dqk, 0.0f);
    v.assign(kv * hk * dvo, 0.0f);
  }
  float& q_at(int64_t i, int h, int d) { return q[(i * p.num_qo_heads + h) * p.head_dim_qk + d]; }
  float& k_at(int64_t j, int h, int d) { return k[(j * p.num_kv_heads + h) * p.head_dim_qk + d]; }
  float& v_at(int64_t j, int h, int d) { return v[(j * p.num_kv_heads + h) * p.head_dim_vo + d]; }
  float o(int64_t i, int h, int d) const {
    return out[(i * p.num_qo_heads + h) * p.head_dim_vo + d];
  }
  float lse_at(int64_t i, int h) const { return lse[i * p.num_qo_heads + h]; }

  AttentionArgs args() {
    const int64_t hq = p.num_qo_heads, hk = p.num_kv_heads;
    out.assign(qo_len * hq * p.head_dim_vo, NAN);
    lse.assign(qo_len * hq, NAN);
    AttentionArgs a;
    const bool decode = p.op == Op::kSingleDecode;
    a.q = decode ? TensorView::contiguous(q.data(), DType::kF32, {hq, p.head_dim_qk})
                 : TensorView::contiguous(q.data(), DType::kF32, {qo_len, hq, p.head_dim_qk});
    if (p.kv_dtype == DType::kF32) {
      a.k = TensorView::contiguous(k.data(), DType::kF32, {kv_len, hk, p.head_dim_qk});
      a.v = TensorView::contiguous(v.data(), DType::kF32, {kv_len, hk, p.head_dim_vo});
    } else {
      k_bytes.resize(k.size() * dtype_size(p.kv_dtype));
      v_bytes.resize(v.size() * dtype_size(p.kv_dtype));
      testing::from_f32(k.data(), static_cast<int64_t>(k.size()), p.kv_dtype, k_bytes.data());
      testing::from_f32(v.data(), static_cast<int64_t>(v.size()), p.kv_dtype, v_bytes.data());
      a.k = TensorView::contiguous(k_bytes.data(), p.kv_dtype, {kv_len, hk, p.head_dim_qk});
      a.v = TensorView::contiguous(v_bytes.data(), p.kv_dtype, {kv_len, hk, p.head_dim_vo});
    }
    a.out = decode ? TensorView::contiguous(out.data(), DType::kF32, {hq, p.head_dim_vo})
                   : TensorView::contiguous(out.data(), DType::kF32, {qo_len, hq, p.head_dim_vo});
    a.scalars = scalars;
    if (return_lse) {
      a.lse = decode ? TensorView::contiguous(lse.data(), DType::kF32, {hq})
                     : TensorView::contiguous(lse.data(), DType::kF32, {qo_len, hq});
    }
    if (!mask.empty()) {
      a.custom_mask =
          TensorView::contiguous(mask.data(), DType::kU8, {static_cast<int64_t>(mask.size())});
      a.custom_mask_packed = mask_packed;
    }
    if (!alibi_slopes.empty()) {
      a.alibi_slopes = TensorView::contiguous(alibi_slopes.data(), DType::kF32, {hq});
    }
    if (!sinks.empty()) a.sinks = TensorView::contiguous(sinks.data(), DType::kF32, {hq});
    if (!k_scale.empty()) a.k_scale = TensorView::contiguous(k_scale.data(), DType::kF32, {hk});
    if (!v_scale.empty()) a.v_scale = TensorView::contiguous(v_scale.data(), DType::kF32, {hk});
    if (!k_scale_cache.empty()) {
      a.k_scale_cache = TensorView::contiguous(k_scale_cache.data(), DType::kF32, {kv_len, hk});
    }
    if (!v_scale_cache.empty()) {
      a.v_scale_cache = TensorView::contiguous(v_scale_cache.data(), DType::kF32, {kv_len, hk});
    }
    return a;
  }
  void run() {
    AttentionArgs a = args();
    Status st = run_reference(p, a);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
};

// Random data of several requests, each held contiguously: q [qo, Hq, Dqk], k [kv, Hk, Dqk],
// v [kv, Hk, Dvo], all in the problem's dtypes (raw bytes).
struct Batch {
  Problem p;  // the op is set by each run_*
  RunScalars scalars;  // every run_* passes them
  std::vector<int64_t> qo_lens, kv_lens;
  std::vector<std::vector<std::byte>> q, k, v;

  Batch(const Problem& problem, std::vector<int64_t> qo, std::vector<int64_t> kv, uint64_t seed)
      : p(problem), qo_lens(std::move(qo)), kv_lens(std::move(kv)) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    auto fill = [&](std::vector<std::byte>* buf, DType dtype, int64_t n) {
      std::vector<float> values(n);
      for (float& x : values) x = dist(rng);
      buf->resize(n * dtype_size(dtype));
      testing::from_f32(values.data(), n, dtype, buf->data());
    };
    for (std::size_t b = 0; b < qo_lens.size(); ++b) {
      q.emplace_back();
      k.emplace_back();
      v.emplace_back();
      fill(&q.back(), p.q_dtype, qo_lens[b] * p.num_qo_heads * p.head_dim_qk);
      fill(&k.back(), p.kv_dtype, kv_lens[b] * p.num_kv_heads * p.head_dim_qk);
      fill(&v.back(), p.kv_dtype, kv_lens[b] * p.num_kv_heads * p.head_dim_vo);
    }
  }
  int batch() const { return static_cast<int>(qo_lens.size()); }
  int64_t total_qo() const { return std::accumulate(qo_lens.begin(), qo_lens.end(), int64_t{0}); }
  std::size_t kv_esize() const { return dtype_size(p.kv_dtype); }
};

// Paged layout options for Batch::run_paged.
struct PagedLayout {
  int page_size = 4;
  KVLayout layout = KVLayout::kNHD;
  bool combined = false;  // one [P, 2, ...] buffer
  bool shuffle = true;
  int extra_pages = 2;
  uint64_t seed = 7;
};

// Output of one run: out f32 [N, Hq, Dvo] and lse [N, Hq], rows in request order.
struct Result {
  std::vector<float> out, lse;
};

Result run_single(const Batch& batch, int b, bool decode, KVLayout layout = KVLayout::kNHD);
Result run_ragged(const Batch& batch);
Result run_paged(const Batch& batch, const PagedLayout& layout, bool decode);

}  // namespace kvattn::reftest
