// The main job: one serving step of a Llama-3-8B-shaped attention layer (32 query heads, 8 KV
// heads, head dim 128) for a batch of requests of different lengths whose KV cache lives in
// pages of FP8 (e4m3) with per-tensor scales. It appends the requests' K/V into the cache
// (quantizing), runs the prefill (extend) of their new tokens and then one decode token each, on
// the backend kvattn selects, and checks both against the reference backend.
//
//   kvattn_serving_step [--quick] [--backend NAME] [--threads N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvattn/kvattn.h"
#include "testing/case_builder.h"  // f32 <-> bf16 conversion of the demo's random data

namespace {

using kvattn::DType;
using kvattn::TensorView;

constexpr int kQoHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;

struct Options {
  bool quick = false;
  std::string backend = "auto";
  int threads = 0;
};

bool fail(const char* what, const kvattn::Status& s) {
  if (s.ok()) return false;
  std::fprintf(stderr, "%s failed: %s\n", what, s.to_string().c_str());
  return true;
}

std::vector<uint16_t> random_bf16(int64_t n, std::mt19937& rng, float* max_abs) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> f(n);
  for (float& x : f) x = dist(rng);
  for (float x : f) *max_abs = std::max(*max_abs, std::fabs(x));
  std::vector<uint16_t> out(n);
  kvattn::testing::from_f32(f.data(), n, DType::kBF16, out.data());
  return out;
}

// The paged cache of the batch: a pool of pages, each request's pages in a random order.
struct PagedCache {
  int64_t num_pages = 0;
  std::vector<uint8_t> k, v;  // e4m3 [num_pages, page_size, H_kv, D]
  std::vector<int32_t> indptr, indices, last_page_len;
  std::vector<int32_t> page_of;  // scratch
  float k_scale = 1, v_scale = 1;

  void layout(const std::vector<int64_t>& lens, std::mt19937& rng) {
    indptr.assign(1, 0);
    std::vector<int32_t> pool(num_pages);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    indices.clear();
    last_page_len.clear();
    for (int64_t len : lens) {
      int64_t pages = (len + kPageSize - 1) / kPageSize;
      for (int64_t p = 0; p < pages; ++p) indices.push_back(pool[indices.size()]);
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last_page_len.push_back(static_cast<int32_t>(pages ? len - (pages - 1) * kPageSize : 0));
    }
  }
  kvattn::PagedKVCache view() {
    kvattn::PagedKVCache c;
    c.k_cache = TensorView::contiguous(k.data(), DType::kE4M3, {num_pages, kPageSize, kKvHeads, kHeadDim});
    c.v_cache = TensorView::contiguous(v.data(), DType::kE4M3, {num_pages, kPageSize, kKvHeads, kHeadDim});
    c.kv_indptr = TensorView::contiguous(indptr.data(), DType::kI32, {(int64_t)indptr.size()});
    c.kv_indices = TensorView::contiguous(indices.data(), DType::kI32, {(int64_t)indices.size()});
    c.kv_last_page_len =
        TensorView::contiguous(last_page_len.data(), DType::kI32, {(int64_t)last_page_len.size()});
    c.k_scale = k_scale;
    c.v_scale = v_scale;
    return c;
  }
};

// Appends tokens [from[b], to[b]) of each request (random bf16 K/V) into the cache.
bool append_tokens(PagedCache& cache, const std::vector<int64_t>& from,
                   const std::vector<int64_t>& to, std::mt19937& rng) {
  std::vector<int32_t> batch_indices, positions;
  for (std::size_t b = 0; b < from.size(); ++b) {
    for (int64_t t = from[b]; t < to[b]; ++t) {
      batch_indices.push_back(static_cast<int32_t>(b));
      positions.push_back(static_cast<int32_t>(t));
    }
  }
  const int64_t nnz = static_cast<int64_t>(positions.size());
  float kmax = 0, vmax = 0;
  std::vector<uint16_t> k = random_bf16(nnz * kKvHeads * kHeadDim, rng, &kmax);
  std::vector<uint16_t> v = random_bf16(nnz * kKvHeads * kHeadDim, rng, &vmax);
  kvattn::Status s = kvattn::append_paged_kv_cache(
      TensorView::contiguous(k.data(), DType::kBF16, {nnz, kKvHeads, kHeadDim}),
      TensorView::contiguous(v.data(), DType::kBF16, {nnz, kKvHeads, kHeadDim}),
      TensorView::contiguous(batch_indices.data(), DType::kI32, {nnz}),
      TensorView::contiguous(positions.data(), DType::kI32, {nnz}), cache.view());
  return !fail("append_paged_kv_cache", s);
}

struct Compared {
  double max_abs = 0, ref_max = 0;
};

Compared compare_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref) {
  std::vector<float> g(got.size()), r(ref.size());
  kvattn::testing::to_f32(got.data(), DType::kBF16, (int64_t)got.size(), g.data());
  kvattn::testing::to_f32(ref.data(), DType::kBF16, (int64_t)ref.size(), r.data());
  Compared c;
  for (std::size_t i = 0; i < g.size(); ++i) {
    double e = std::isfinite(g[i]) ? std::fabs(double(g[i]) - r[i]) : INFINITY;
    c.max_abs = std::max(c.max_abs, e);
    c.ref_max = std::max(c.ref_max, std::fabs(double(r[i])));
  }
  return c;
}

// Runs `problem` on the selected backend (timed) and on the reference; prints one report line.
bool run_and_check(const char* label, const kvattn::Problem& problem, kvattn::AttentionArgs args,
                   int64_t rows, const Options& opt, double flops, double bytes) {
  std::vector<uint16_t> out(rows * kQoHeads * kHeadDim), ref(out.size());
  const int64_t out_shape0 = rows;
  args.out = TensorView::contiguous(out.data(), DType::kBF16, {out_shape0, kQoHeads, kHeadDim});
  kvattn::PlanOptions po;
  po.backend = opt.backend;
  po.num_threads = opt.threads;
  kvattn::Plan plan;
  if (fail("plan", kvattn::plan(problem, args, po, &plan))) return false;
  // One warm-up, then the median of a few runs (a plan is reused across layers like this).
  std::vector<double> ms;
  for (int i = 0; i < 4; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (fail("run", kvattn::run(plan, args))) return false;
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
  }
  std::sort(ms.begin() + 1, ms.end());
  double median = ms[1 + (ms.size() - 1) / 2];

  kvattn::AttentionArgs ref_args = args;
  ref_args.out = TensorView::contiguous(ref.data(), DType::kBF16, {out_shape0, kQoHeads, kHeadDim});
  kvattn::PlanOptions ro;
  ro.backend = "reference";
  if (fail("reference", kvattn::run(problem, ref_args, ro))) return false;
  Compared c = compare_bf16(out, ref);
  // bf16 output: one rounding of the result is 2^-8 relative; allow a few of them.
  const double bound = 4 * std::ldexp(1.0, -8) * std::max(1.0, c.ref_max);
  std::printf("%-8s backend=%-9s %8.3f ms  %7.1f GFLOP/s  %6.1f GB/s  max|err| vs reference = %.3g"
              " (bound %.3g) %s\n",
              label, plan.backend.c_str(), median, flops / median / 1e6, bytes / median / 1e6,
              c.max_abs, bound, c.max_abs <= bound ? "OK" : "FAIL");
  return c.max_abs <= bound;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--backend" && i + 1 < argc) {
      opt.backend = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      opt.threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--backend NAME] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  std::mt19937 rng(2026);
  // Requests: tokens already in the cache (prefix) and new tokens to prefill.
  std::vector<int64_t> prefix = opt.quick ? std::vector<int64_t>{40, 0, 129, 16}
                                          : std::vector<int64_t>{1500, 0, 713, 3072, 16, 255};
  std::vector<int64_t> extend = opt.quick ? std::vector<int64_t>{8, 33, 1, 16}
                                          : std::vector<int64_t>{64, 511, 1, 128, 17, 300};
  const int batch = static_cast<int>(prefix.size());
  std::vector<int64_t> after_prefill(batch), after_decode(batch);
  for (int b = 0; b < batch; ++b) {
    after_prefill[b] = prefix[b] + extend[b];
    after_decode[b] = after_prefill[b] + 1;
  }

  PagedCache cache;
  for (int64_t len : after_decode) cache.num_pages += (len + kPageSize - 1) / kPageSize;
  cache.num_pages += 3;  // free pages in the pool
  cache.k.assign(cache.num_pages * kPageSize * kKvHeads * kHeadDim, 0);
  cache.v.assign(cache.k.size(), 0);
  // Per-tensor scales so N(0,1) values use the e4m3 range: |x| <= ~5 maps below 448.
  cache.k_scale = cache.v_scale = 5.0f / 448.0f;
  cache.layout(after_decode, rng);  // pages reserved for the whole step

  std::printf("kvattn %s serving step: Llama-3-8B layer (H_qo %d, H_kv %d, d %d), %d requests, "
              "paged e4m3 cache (page %d, %lld pages), bf16 q/o, device %s\n",
              kvattn::version_string(), kQoHeads, kKvHeads, kHeadDim, batch, kPageSize,
              (long long)cache.num_pages, kvattn::Device::cpu().to_string().c_str());

  // The page table as each call sees it: lengths after prefill, then after decode.
  auto page_table_for = [&](const std::vector<int64_t>& lens) {
    PagedCache t = cache;
    t.k.clear();
    t.v.clear();
    std::vector<int32_t> last;
    for (int b = 0; b < batch; ++b) {
      int64_t pages = (lens[b] + kPageSize - 1) / kPageSize;
      t.indptr[b + 1] = t.indptr[b] + static_cast<int32_t>(pages);
      last.push_back(static_cast<int32_t>(pages ? lens[b] - (pages - 1) * kPageSize : 0));
    }
    std::vector<int32_t> indices;
    for (int b = 0; b < batch; ++b) {
      int64_t pages = t.indptr[b + 1] - t.indptr[b];
      for (int64_t p = 0; p < pages; ++p) indices.push_back(cache.indices[cache.indptr[b] + p]);
    }
    t.indices = indices;
    t.last_page_len = last;
    return t;
  };

  // --- prefill (extend): append prefix + new tokens, then attend causally ---
  PagedCache pt = page_table_for(after_prefill);
  std::swap(pt.k, cache.k);
  std::swap(pt.v, cache.v);
  bool ok = append_tokens(pt, std::vector<int64_t>(batch, 0), after_prefill, rng);
  kvattn::Problem prefill;
  prefill.op = kvattn::Op::kBatchPrefillPaged;
  prefill.batch_size = batch;
  prefill.num_qo_heads = kQoHeads;
  prefill.num_kv_heads = kKvHeads;
  prefill.head_dim_qk = prefill.head_dim_vo = kHeadDim;
  prefill.page_size = kPageSize;
  prefill.q_dtype = prefill.o_dtype = DType::kBF16;
  prefill.kv_dtype = DType::kE4M3;
  prefill.mask_mode = kvattn::MaskMode::kCausal;
  std::vector<int32_t> qo_indptr(1, 0);
  for (int64_t n : extend) qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(n));
  const int64_t nq = qo_indptr.back();
  float unused = 0;
  std::vector<uint16_t> q = random_bf16(nq * kQoHeads * kHeadDim, rng, &unused);
  kvattn::PagedKVCache cv = pt.view();
  kvattn::AttentionArgs args;
  args.q = TensorView::contiguous(q.data(), DType::kBF16, {nq, kQoHeads, kHeadDim});
  args.qo_indptr = TensorView::contiguous(qo_indptr.data(), DType::kI32, {batch + 1});
  args.paged_k_cache = cv.k_cache;
  args.paged_v_cache = cv.v_cache;
  args.kv_indptr = cv.kv_indptr;
  args.kv_indices = cv.kv_indices;
  args.kv_last_page_len = cv.kv_last_page_len;
  args.scalars.k_scale = pt.k_scale;  // this layer's scales: run values, not the plan's
  args.scalars.v_scale = pt.v_scale;
  double flops = 0, bytes = 0;
  for (int b = 0; b < batch; ++b) {
    double lq = double(extend[b]), lkv = double(after_prefill[b]);
    flops += (2 * lkv - lq) * lq * kQoHeads * 2 * kHeadDim;
    bytes += lkv * kKvHeads * kHeadDim * 2 + lq * kQoHeads * kHeadDim * 4;
  }
  std::printf("prefill: %s\n", prefill.to_string().c_str());
  ok = ok && run_and_check("prefill", prefill, args, nq, opt, flops, bytes);

  // --- decode: append one token per request, one query each ---
  PagedCache dt = page_table_for(after_decode);
  std::swap(dt.k, pt.k);
  std::swap(dt.v, pt.v);
  ok = ok && append_tokens(dt, after_prefill, after_decode, rng);
  kvattn::Problem decode = prefill;
  decode.op = kvattn::Op::kBatchDecode;
  decode.mask_mode = kvattn::MaskMode::kNone;
  std::vector<uint16_t> qd = random_bf16(int64_t(batch) * kQoHeads * kHeadDim, rng, &unused);
  kvattn::PagedKVCache dv = dt.view();
  kvattn::AttentionArgs dargs;
  dargs.q = TensorView::contiguous(qd.data(), DType::kBF16, {batch, kQoHeads, kHeadDim});
  dargs.paged_k_cache = dv.k_cache;
  dargs.paged_v_cache = dv.v_cache;
  dargs.kv_indptr = dv.kv_indptr;
  dargs.kv_indices = dv.kv_indices;
  dargs.kv_last_page_len = dv.kv_last_page_len;
  dargs.scalars = args.scalars;
  flops = bytes = 0;
  for (int b = 0; b < batch; ++b) {
    double lkv = double(after_decode[b]);
    flops += 2 * lkv * kQoHeads * 2 * kHeadDim;
    bytes += lkv * kKvHeads * kHeadDim * 2 + kQoHeads * kHeadDim * 4;
  }
  std::printf("decode:  %s\n", decode.to_string().c_str());
  ok = ok && run_and_check("decode", decode, dargs, batch, opt, flops, bytes);
  std::printf("%s\n", ok ? "serving step OK" : "serving step FAILED");
  return ok ? 0 : 1;
}
