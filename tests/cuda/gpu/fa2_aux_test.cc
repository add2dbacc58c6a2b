// fa2's merge_state(s), append_paged_kv_cache and apply_rope on a GPU against the reference
// backend on the host, on random data. Skips with the reason when there is no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/gpu/device_mirror.h"
#include "kvattn/kvattn.h"
#include "testing/case_builder.h"

namespace kvattn::fa2::test {
namespace {

class Fa2GpuAux : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    std::optional<Device> d = gpu_or_reason(&why);
    if (!d) GTEST_SKIP() << why;
    fa2_.backend = "fa2";
    fa2_.device = *d;
    ref_.backend = "reference";
  }
  OpOptions fa2_, ref_;
};

// Host buffer of `n` elements of `dtype` holding uniform values in [-r, r].
std::vector<std::byte> random_buffer(DType dtype, int64_t n, float r, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-r, r);
  std::vector<float> f(static_cast<size_t>(n));
  for (float& x : f) x = u(rng);
  std::vector<std::byte> raw(size_t(n) * dtype_size(dtype));
  testing::from_f32(f.data(), n, dtype, raw.data());
  return raw;
}

// |a - b| <= rtol * |b| + atol elementwise, both read as f32.
void expect_close(const std::vector<std::byte>& a, const std::vector<std::byte>& b, DType dtype,
                  int64_t n, double rtol, double atol, const char* what) {
  std::vector<float> fa(static_cast<size_t>(n)), fb(static_cast<size_t>(n));
  testing::to_f32(a.data(), dtype, n, fa.data());
  testing::to_f32(b.data(), dtype, n, fb.data());
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool both_inf = std::isinf(fa[i]) && fa[i] == fb[i];
    if (!both_inf && !(std::abs(fa[i] - fb[i]) <= rtol * std::abs(fb[i]) + atol)) {
      if (bad++ < 3) ADD_FAILURE() << what << "[" << i << "]: " << fa[i] << " vs " << fb[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST_F(Fa2GpuAux, MergeStateAndMergeStates) {
  const int64_t N = 37, S = 5, H = 4, D = 128;
  for (DType vt : {DType::kF32, DType::kBF16}) {
    auto v = random_buffer(vt, N * S * H * D, 1.0f, 1);
    auto s = random_buffer(DType::kF32, N * S * H, 8.0f, 2);
    // Some states saw no key.
    float* lse = reinterpret_cast<float*>(s.data());
    for (int64_t i = 0; i < N * S * H; i += 7) lse[i] = -INFINITY;
    for (int64_t i = 0; i < H; ++i) {
      for (int64_t k = 0; k < S; ++k) lse[(0 * S + k) * H + i] = -INFINITY;  // a whole row
    }
    TensorView vh = TensorView::contiguous(v.data(), vt, {N, S, H, D});
    TensorView sh = TensorView::contiguous(s.data(), DType::kF32, {N, S, H});
    std::vector<std::byte> out_ref(size_t(N * H * D) * dtype_size(vt)), out_gpu(out_ref.size());
    std::vector<std::byte> lse_ref(size_t(N * H) * 4), lse_gpu(lse_ref.size());
    TensorView oref = TensorView::contiguous(out_ref.data(), vt, {N, H, D});
    TensorView lref = TensorView::contiguous(lse_ref.data(), DType::kF32, {N, H});
    TensorView ogpu = TensorView::contiguous(out_gpu.data(), vt, {N, H, D});
    TensorView lgpu = TensorView::contiguous(lse_gpu.data(), DType::kF32, {N, H});
    ASSERT_TRUE(merge_states(vh, sh, oref, lref, ref_).ok());
    DeviceMirror m;
    TensorView od = m.to_device(ogpu), ld = m.to_device(lgpu);
    Status st = merge_states(m.to_device(vh), m.to_device(sh), od, ld, fa2_);
    ASSERT_TRUE(st.ok()) << st.message();
    m.to_host(od, ogpu);
    m.to_host(ld, lgpu);
    const double rtol = vt == DType::kF32 ? 1e-5 : 1.0 / 128;
    expect_close(out_gpu, out_ref, vt, N * H * D, rtol, 1e-6, "merge_states o");
    expect_close(lse_gpu, lse_ref, DType::kF32, N * H, 1e-5, 1e-5, "merge_states lse");

    // merge_state of states 0 and 1 as two strided views of the same buffers.
    TensorView va = TensorView::strided(v.data(), vt, {N, H, D}, {S * H * D, D, 1});
    TensorView vb = TensorView::strided(static_cast<std::byte*>(v.data()) + H * D * dtype_size(vt),
                                        vt, {N, H, D}, {S * H * D, D, 1});
    TensorView sa = TensorView::strided(s.data(), DType::kF32, {N, H}, {S * H, 1});
    TensorView sb = TensorView::strided(reinterpret_cast<float*>(s.data()) + H, DType::kF32, {N, H},
                                        {S * H, 1});
    ASSERT_TRUE(merge_state(va, sa, vb, sb, oref, lref, ref_).ok());
    DeviceMirror m2;
    od = m2.to_device(ogpu);
    ld = m2.to_device(lgpu);
    st = merge_state(m2.to_device(va), m2.to_device(sa), m2.to_device(vb), m2.to_device(sb), od, ld,
                     fa2_);
    ASSERT_TRUE(st.ok()) << st.message();
    m2.to_host(od, ogpu);
    m2.to_host(ld, lgpu);
    expect_close(out_gpu, out_ref, vt, N * H * D, rtol, 1e-6, "merge_state o");
    expect_close(lse_gpu, lse_ref, DType::kF32, N * H, 1e-5, 1e-5, "merge_state lse");
  }
}

TEST_F(Fa2GpuAux, AppendPagedKVCacheQuantizesLikeTheReference) {
  const int64_t P = 9, page = 16, H = 2, D = 128;
  for (DType cache_t : {DType::kBF16, DType::kE4M3, DType::kE5M2}) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      const std::vector<int32_t> indptr = {0, 3, 5}, indices = {4, 0, 7, 2, 8}, last = {10, 16};
      const std::vector<int32_t> batch = {0, 0, 1, 1, 1}, pos = {40, 41, 3, 17, 31};
      const int64_t nnz = int64_t(batch.size());
      auto k_in = random_buffer(DType::kBF16, nnz * H * D, 600.0f, 3);  // past e4m3's 448
      auto v_in = random_buffer(DType::kBF16, nnz * H * D, 2.0f, 4);
      const int64_t cache_elems = P * page * H * D;
      std::vector<std::byte> kc_ref(size_t(cache_elems) * dtype_size(cache_t)), vc_ref(kc_ref);
      std::vector<std::byte> kc_gpu(kc_ref), vc_gpu(kc_ref);
      auto cache_view = [&](std::vector<std::byte>& b) {
        return layout == KVLayout::kNHD
                   ? TensorView::contiguous(b.data(), cache_t, {P, page, H, D})
                   : TensorView::contiguous(b.data(), cache_t, {P, H, page, D});
      };
      PagedKVCache ref_cache{cache_view(kc_ref),
                             cache_view(vc_ref),
                             TensorView::contiguous((void*)indptr.data(), DType::kI32, {3}),
                             TensorView::contiguous((void*)indices.data(), DType::kI32, {5}),
                             TensorView::contiguous((void*)last.data(), DType::kI32, {2}),
                             layout,
                             1.5f,
                             0.25f};
      TensorView ak = TensorView::contiguous(k_in.data(), DType::kBF16, {nnz, H, D});
      TensorView av = TensorView::contiguous(v_in.data(), DType::kBF16, {nnz, H, D});
      TensorView bi = TensorView::contiguous((void*)batch.data(), DType::kI32, {nnz});
      TensorView ps = TensorView::contiguous((void*)pos.data(), DType::kI32, {nnz});
      Status st = append_paged_kv_cache(ak, av, bi, ps, ref_cache, ref_);
      ASSERT_TRUE(st.ok()) << st.message();
      DeviceMirror m;
      PagedKVCache gpu_cache = ref_cache;
      gpu_cache.k_cache = m.to_device(cache_view(kc_gpu));
      gpu_cache.v_cache = m.to_device(cache_view(vc_gpu));
      st = append_paged_kv_cache(m.to_device(ak), m.to_device(av), bi, ps, gpu_cache, fa2_);
      ASSERT_TRUE(st.ok()) << st.message();
      m.to_host(gpu_cache.k_cache, cache_view(kc_gpu));
      m.to_host(gpu_cache.v_cache, cache_view(vc_gpu));
      // The reference rounds from fp64, fa2 from f32: at most one step apart on a tie.
      const double step = cache_t == DType::kE4M3   ? 1.0 / 8
                          : cache_t == DType::kE5M2 ? 0.25
                                                    : 1.0 / 128;
      expect_close(kc_gpu, kc_ref, cache_t, cache_elems, step, 1e-6, "k cache");
      expect_close(vc_gpu, vc_ref, cache_t, cache_elems, step, 1e-6, "v cache");
    }
  }
}

// Issue 20: a row whose batch index is -1 is padding and writes nothing (DESIGN.md §2
// "Appending"); its position is not read. Both caches start as the same canary; the reference
// (checked byte for byte on the CPU, tests/cpu/aux_ops_test.cc) leaves every non-real slot as
// the canary, and fa2 must match it everywhere, scales included.
TEST_F(Fa2GpuAux, AppendSkipsPaddedRows) {
  const int64_t P = 9, page = 16, H = 2, D = 128;
  for (bool per_token : {false, true}) {
    const DType cache_t = per_token ? DType::kE4M3 : DType::kBF16;
    const std::vector<int32_t> indptr = {0, 3, 5}, indices = {4, 0, 7, 2, 8}, last = {10, 16};
    const std::vector<int32_t> batch = {-1, 0, -1, 1, 1, -1}, pos = {-5, 41, 9999, 3, 31, 0};
    const int64_t nnz = int64_t(batch.size());
    auto k_in = random_buffer(DType::kBF16, nnz * H * D, 100.0f, 11);
    auto v_in = random_buffer(DType::kBF16, nnz * H * D, 2.0f, 12);
    const int64_t cache_elems = P * page * H * D;
    std::vector<std::byte> kc_ref(size_t(cache_elems) * dtype_size(cache_t), std::byte{0x11});
    std::vector<std::byte> vc_ref(kc_ref), kc_gpu(kc_ref), vc_gpu(kc_ref);
    std::vector<float> ks_ref(size_t(P * page * H), -3.25f), vs_ref(ks_ref), ks_gpu(ks_ref),
        vs_gpu(ks_ref);
    auto cache_view = [&](std::vector<std::byte>& b) {
      return TensorView::contiguous(b.data(), cache_t, {P, page, H, D});
    };
    auto scale_view = [&](std::vector<float>& b) {
      return TensorView::contiguous(b.data(), DType::kF32, {P, page, H});
    };
    PagedKVCache ref_cache{cache_view(kc_ref),
                           cache_view(vc_ref),
                           TensorView::contiguous((void*)indptr.data(), DType::kI32, {3}),
                           TensorView::contiguous((void*)indices.data(), DType::kI32, {5}),
                           TensorView::contiguous((void*)last.data(), DType::kI32, {2}),
                           KVLayout::kNHD};
    if (per_token) {
      ref_cache.scale_granularity = KVScaleGranularity::kPerTokenHead;
      ref_cache.k_scale_cache = scale_view(ks_ref);
      ref_cache.v_scale_cache = scale_view(vs_ref);
    }
    TensorView ak = TensorView::contiguous(k_in.data(), DType::kBF16, {nnz, H, D});
    TensorView av = TensorView::contiguous(v_in.data(), DType::kBF16, {nnz, H, D});
    TensorView bi = TensorView::contiguous((void*)batch.data(), DType::kI32, {nnz});
    TensorView ps = TensorView::contiguous((void*)pos.data(), DType::kI32, {nnz});
    Status st = append_paged_kv_cache(ak, av, bi, ps, ref_cache, ref_);
    ASSERT_TRUE(st.ok()) << st.message();
    DeviceMirror m;
    PagedKVCache gpu_cache = ref_cache;
    gpu_cache.k_cache = m.to_device(cache_view(kc_gpu));
    gpu_cache.v_cache = m.to_device(cache_view(vc_gpu));
    if (per_token) {
      gpu_cache.k_scale_cache = m.to_device(scale_view(ks_gpu));
      gpu_cache.v_scale_cache = m.to_device(scale_view(vs_gpu));
    }
    st = append_paged_kv_cache(m.to_device(ak), m.to_device(av), bi, ps, gpu_cache, fa2_);
    ASSERT_TRUE(st.ok()) << st.message();
    m.to_host(gpu_cache.k_cache, cache_view(kc_gpu));
    m.to_host(gpu_cache.v_cache, cache_view(vc_gpu));
    if (per_token) {
      m.to_host(gpu_cache.k_scale_cache, scale_view(ks_gpu));
      m.to_host(gpu_cache.v_scale_cache, scale_view(vs_gpu));
    }
    EXPECT_EQ(ks_gpu, ks_ref);
    EXPECT_EQ(vs_gpu, vs_ref);
    const double step = per_token ? 1.0 / 8 : 1.0 / 128;
    expect_close(kc_gpu, kc_ref, cache_t, cache_elems, step, 1e-6, "k cache");
    expect_close(vc_gpu, vc_ref, cache_t, cache_elems, step, 1e-6, "v cache");
  }
}

// Issue 11: per_token_head appends store each (token, head)'s scale beside the row.
TEST_F(Fa2GpuAux, AppendPerTokenHeadStoresScalesLikeTheReference) {
  const int64_t P = 9, page = 16, H = 2, D = 96;
  for (DType cache_t : {DType::kE4M3, DType::kE5M2}) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      const std::vector<int32_t> indptr = {0, 3, 5}, indices = {4, 0, 7, 2, 8}, last = {10, 16};
      const std::vector<int32_t> batch = {0, 0, 1, 1, 1}, pos = {40, 41, 3, 17, 31};
      const int64_t nnz = int64_t(batch.size());
      auto k_in = random_buffer(DType::kBF16, nnz * H * D, 600.0f, 7);
      auto v_in = random_buffer(DType::kBF16, nnz * H * D, 2.0f, 8);
      const int64_t cache_elems = P * page * H * D;
      std::vector<std::byte> kc_ref(size_t(cache_elems) * dtype_size(cache_t)), vc_ref(kc_ref);
      std::vector<std::byte> kc_gpu(kc_ref), vc_gpu(kc_ref);
      std::vector<float> ks_ref(size_t(P * page * H)), vs_ref(ks_ref), ks_gpu(ks_ref),
          vs_gpu(ks_ref);
      auto cache_view = [&](std::vector<std::byte>& b) {
        return layout == KVLayout::kNHD
                   ? TensorView::contiguous(b.data(), cache_t, {P, page, H, D})
                   : TensorView::contiguous(b.data(), cache_t, {P, H, page, D});
      };
      auto scale_view = [&](std::vector<float>& b) {
        return TensorView::contiguous(b.data(), DType::kF32, {P, page, H});
      };
      PagedKVCache ref_cache{cache_view(kc_ref),
                             cache_view(vc_ref),
                             TensorView::contiguous((void*)indptr.data(), DType::kI32, {3}),
                             TensorView::contiguous((void*)indices.data(), DType::kI32, {5}),
                             TensorView::contiguous((void*)last.data(), DType::kI32, {2}),
                             layout};
      ref_cache.scale_granularity = KVScaleGranularity::kPerTokenHead;
      ref_cache.k_scale_cache = scale_view(ks_ref);
      ref_cache.v_scale_cache = scale_view(vs_ref);
      TensorView ak = TensorView::contiguous(k_in.data(), DType::kBF16, {nnz, H, D});
      TensorView av = TensorView::contiguous(v_in.data(), DType::kBF16, {nnz, H, D});
      TensorView bi = TensorView::contiguous((void*)batch.data(), DType::kI32, {nnz});
      TensorView ps = TensorView::contiguous((void*)pos.data(), DType::kI32, {nnz});
      Status st = append_paged_kv_cache(ak, av, bi, ps, ref_cache, ref_);
      ASSERT_TRUE(st.ok()) << st.message();
      DeviceMirror m;
      PagedKVCache gpu_cache = ref_cache;
      gpu_cache.k_cache = m.to_device(cache_view(kc_gpu));
      gpu_cache.v_cache = m.to_device(cache_view(vc_gpu));
      gpu_cache.k_scale_cache = m.to_device(scale_view(ks_gpu));
      gpu_cache.v_scale_cache = m.to_device(scale_view(vs_gpu));
      st = append_paged_kv_cache(m.to_device(ak), m.to_device(av), bi, ps, gpu_cache, fa2_);
      ASSERT_TRUE(st.ok()) << st.message();
      m.to_host(gpu_cache.k_cache, cache_view(kc_gpu));
      m.to_host(gpu_cache.v_cache, cache_view(vc_gpu));
      m.to_host(gpu_cache.k_scale_cache, scale_view(ks_gpu));
      m.to_host(gpu_cache.v_scale_cache, scale_view(vs_gpu));
      EXPECT_EQ(ks_gpu, ks_ref);  // amax / fp8_max rounded once to f32: exact on both
      EXPECT_EQ(vs_gpu, vs_ref);
      const double step = cache_t == DType::kE4M3 ? 1.0 / 8 : 0.25;
      expect_close(kc_gpu, kc_ref, cache_t, cache_elems, step, 1e-6, "k cache");
      expect_close(vc_gpu, vc_ref, cache_t, cache_elems, step, 1e-6, "v cache");
    }
  }
}

TEST_F(Fa2GpuAux, ApplyRopeInPlaceAndOutOfPlace) {
  const int64_t nnz = 29, Hq = 8, Hk = 2, D = 128, max_pos = 1000, cache_dim = 96;
  std::vector<float> cache(size_t(max_pos * cache_dim));
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = float(std::sin(0.37 * double(i)));
  // 0: whole head; 1: rotary_dim 64; 2: Llama 3.1 scaling; 3: a cos/sin cache of rotary dim 96.
  for (int variant = 0; variant < 4; ++variant)
    for (bool interleave : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "variant " << variant << " interleave " << interleave);
      auto q = random_buffer(DType::kBF16, nnz * Hq * D, 1.0f, 5);
      auto k = random_buffer(DType::kBF16, nnz * Hk * D, 1.0f, 6);
      std::vector<int32_t> pos(static_cast<size_t>(nnz));
      for (int64_t i = 0; i < nnz; ++i) pos[size_t(i)] = int32_t(i * 37 % 1000);
      RopeParams rope;
      rope.interleave = interleave;
      rope.rope_theta = 5e5f;
      if (variant == 1) rope.rotary_dim = 64;
      if (variant == 2) {
        rope.rope_scale = 8.0f;
        rope.llama31 = Llama31Scaling{};
      }
      if (variant == 3) {
        rope.cos_sin_cache =
            TensorView::contiguous(cache.data(), DType::kF32, {max_pos, cache_dim});
      }
      TensorView qv = TensorView::contiguous(q.data(), DType::kBF16, {nnz, Hq, D});
      TensorView kv = TensorView::contiguous(k.data(), DType::kBF16, {nnz, Hk, D});
      TensorView pv = TensorView::contiguous(pos.data(), DType::kI32, {nnz});
      std::vector<std::byte> q_ref(q.size()), k_ref(k.size()), q_gpu(q.size()), k_gpu(k);
      TensorView qr = TensorView::contiguous(q_ref.data(), DType::kBF16, {nnz, Hq, D});
      TensorView kr = TensorView::contiguous(k_ref.data(), DType::kBF16, {nnz, Hk, D});
      ASSERT_TRUE(apply_rope(qv, kv, qr, kr, pv, rope, ref_).ok());
      DeviceMirror m;
      TensorView qg = m.to_device(TensorView::contiguous(q_gpu.data(), DType::kBF16, {nnz, Hq, D}));
      TensorView kg = m.to_device(TensorView::contiguous(k_gpu.data(), DType::kBF16, {nnz, Hk, D}));
      // q out of place, k in place.
      RopeParams rope_gpu = rope;
      if (variant == 3) rope_gpu.cos_sin_cache = m.to_device(rope.cos_sin_cache);
      Status st = apply_rope(m.to_device(qv), kg, qg, kg, pv, rope_gpu, fa2_);
      ASSERT_TRUE(st.ok()) << st.message();
      m.to_host(qg, TensorView::contiguous(q_gpu.data(), DType::kBF16, {nnz, Hq, D}));
      m.to_host(kg, TensorView::contiguous(k_gpu.data(), DType::kBF16, {nnz, Hk, D}));
      // f32 angles for positions up to 1000: a few ulps of the angle, then one bf16 rounding.
      expect_close(q_gpu, q_ref, DType::kBF16, nnz * Hq * D, 1.0 / 64, 1e-3, "q");
      expect_close(k_gpu, k_ref, DType::kBF16, nnz * Hk * D, 1.0 / 64, 1e-3, "k");
    }
}

}  // namespace
}  // namespace kvattn::fa2::test
