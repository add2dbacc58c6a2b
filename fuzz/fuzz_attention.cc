// libFuzzer target: bytes -> a small attention problem with its page tables and tensors (shapes,
// strides, buffer sizes, indices and dtypes all drawn from the bytes, mostly valid, sometimes
// broken on purpose) -> validation -> the reference and the cpu backend through the public API.
//
// What counts as a finding (abort): a crash or sanitizer report anywhere; the public API
// accepting what validation refused, or refusing with another kind; the reference failing on a
// validated call; cpu output not within the tolerance rule of the reference when both ran.
// Buffers are allocated with exactly buffer_bytes, so a view that validation wrongly let through
// reads past its allocation and AddressSanitizer reports it.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/backend.h"
#include "core/validate.h"
#include "kvattn/attention.h"
#include "testing/baseline.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::fuzz {
namespace {

// Sizes stay small: the reference is fp64 and every input runs it.
constexpr int kMaxBatch = 4;
constexpr int kMaxQoLen = 5;
constexpr int kMaxKvLen = 24;
constexpr int kMaxKvHeads = 3;
constexpr int kMaxGroup = 3;
constexpr int kMaxHeadDim = 12;

constexpr DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3,
                                 DType::kE5M2};
constexpr DType kOutTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

[[noreturn]] void finding(const char* what, const Status& a, const Status& b, const Problem& p) {
  std::fprintf(stderr, "FINDING: %s\n  first: %s\n  second: %s\n  problem: %s\n", what,
               a.to_string().c_str(), b.to_string().c_str(), p.to_string().c_str());
  std::abort();
}

// One owned buffer and the view over it.
struct Buffer {
  std::vector<uint8_t> bytes;
  TensorView view;
};

// Everything one input builds. Buffers live in a vector sized up front (views point into them).
struct Input {
  Problem problem;
  AttentionArgs args;
  std::vector<Buffer> buffers;
  std::vector<int64_t> qo_lens, kv_lens;
  PlanOptions cpu_options;
};

class Builder {
 public:
  Builder(FuzzedDataProvider& in, Input* out)
      : in_(in), out_(out), rng_(in.ConsumeIntegral<uint32_t>()) {
    out_->buffers.reserve(16);
  }

  // A view of `shape` with strides padded by the bytes (and sometimes a broadcast input dim),
  // over a buffer of exactly buffer_bytes, which is the exact extent unless the bytes shrink or
  // grow it. Float contents are random values in [-range, range]; `ints` fills an i32 tensor.
  TensorView tensor(DType dtype, std::initializer_list<int64_t> shape, bool is_output,
                    const std::vector<int32_t>* ints = nullptr) {
    TensorView t;
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    int i = 0;
    for (int64_t d : shape) t.shape[i++] = d;
    const bool padded = ints == nullptr && in_.ConsumeIntegralInRange(0, 3) == 0;
    int64_t stride = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      const int64_t pad = padded ? in_.ConsumeIntegralInRange(0, 2) : 0;
      t.strides[d] = stride + (d == t.rank - 1 ? 0 : pad);
      stride = t.strides[d] * t.shape[d];
    }
    if (!is_output && ints == nullptr && in_.ConsumeIntegralInRange(0, 7) == 0) {
      t.strides[0] = 0;  // a broadcast input: valid, every row reads the same memory
    }
    int64_t extent = 0;
    bool empty = false;
    for (int d = 0; d < t.rank; ++d) {
      if (t.shape[d] == 0) empty = true;
      extent += (t.shape[d] - 1) * t.strides[d];
    }
    const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
    int64_t bytes = empty ? 0 : (extent + 1) * esize;
    switch (in_.ConsumeIntegralInRange(0, 15)) {
      case 0:
        bytes -= 1;
        break;  // one byte short: must be refused
      case 1:
        bytes += esize * 3;
        break;  // slack: fine
      default:
        break;
    }
    Buffer& b = out_->buffers.emplace_back();
    b.bytes.resize(static_cast<size_t>(std::max<int64_t>(bytes, 0)));
    t.buffer_bytes = bytes;
    t.data = b.bytes.empty() ? nullptr : b.bytes.data();
    if (t.data == nullptr && !empty) t.data = &sentinel_;  // non-null, zero bytes behind it
    if (ints) {
      const size_t n = std::min(ints->size() * 4, b.bytes.size());
      if (n > 0) std::memcpy(b.bytes.data(), ints->data(), n);
    } else if (!is_output && !is_float(dtype)) {
      for (uint8_t& byte : b.bytes) byte = static_cast<uint8_t>(rng_());
    } else if (!is_output && !b.bytes.empty()) {
      std::uniform_real_distribution<float> dist(-range_, range_);
      std::vector<float> values(b.bytes.size() / static_cast<size_t>(esize));
      for (float& v : values) v = dist(rng_);
      testing::from_f32(values.data(), static_cast<int64_t>(values.size()), dtype, b.bytes.data());
    }
    b.view = t;
    return t;
  }

  float range_ = 1.0f;

 private:
  FuzzedDataProvider& in_;
  Input* out_;
  std::mt19937 rng_;
  uint8_t sentinel_ = 0;
};

void build(FuzzedDataProvider& in, Input* input) {
  Problem& p = input->problem;
  RunScalars& run = input->args.scalars;  // the layer's run values
  p.op = static_cast<Op>(in.ConsumeIntegralInRange(0, 5));
  const bool batch = is_batch(p.op);
  p.batch_size = batch ? in.ConsumeIntegralInRange(in.ConsumeBool() ? 1 : 0, kMaxBatch) : 1;
  p.num_kv_heads = in.ConsumeIntegralInRange(1, kMaxKvHeads);
  p.num_qo_heads = p.num_kv_heads * in.ConsumeIntegralInRange(1, kMaxGroup);
  if (in.ConsumeIntegralInRange(0, 31) == 0) p.num_qo_heads += 1;  // sometimes not a multiple
  p.head_dim_qk = in.ConsumeIntegralInRange(1, kMaxHeadDim);
  p.head_dim_vo = in.ConsumeBool() ? p.head_dim_qk : in.ConsumeIntegralInRange(1, kMaxHeadDim);
  p.page_size = in.ConsumeIntegralInRange(1, 6);
  p.kv_layout = in.ConsumeBool() ? KVLayout::kNHD : KVLayout::kHND;
  p.q_dtype = in.PickValueInArray(kFloatTypes);
  p.kv_dtype = in.PickValueInArray(kFloatTypes);
  p.o_dtype = in.PickValueInArray(kOutTypes);
  p.mask_mode = static_cast<MaskMode>(in.ConsumeIntegralInRange(0, 2));
  p.window_left = in.ConsumeIntegralInRange(-1, 8);
  p.logits_soft_cap = in.ConsumeBool() ? 0.0f : in.ConsumeFloatingPointInRange(0.5f, 50.0f);
  if (in.ConsumeBool()) p.sm_scale = in.ConsumeFloatingPointInRange(0.01f, 2.0f);
  p.pos_encoding_mode = static_cast<PosEncoding>(in.ConsumeIntegralInRange(0, 2));
  if (p.pos_encoding_mode == PosEncoding::kRopeLlama && p.head_dim_qk % 2 != 0 &&
      in.ConsumeIntegralInRange(0, 7) != 0) {
    p.head_dim_qk += 1;  // mostly valid; sometimes the odd dim that must be refused
  }
  p.rope_interleave = in.ConsumeBool();
  p.rope_theta = in.ConsumeBool() ? 1e4f : in.ConsumeFloatingPointInRange(1.0f, 1e6f);
  p.rope_scale = in.ConsumeBool() ? 1.0f : in.ConsumeFloatingPointInRange(0.25f, 8.0f);
  const float scales[] = {1.0f, 0.5f, 2.0f, 0.01f, NAN, -1.0f, 0.0f, INFINITY};
  const int scale_choices = in.ConsumeIntegralInRange(0, 31) == 0 ? 8 : 4;
  run.q_scale = scales[in.ConsumeIntegralInRange(0, scale_choices - 1)];
  run.k_scale = scales[in.ConsumeIntegralInRange(0, scale_choices - 1)];
  run.v_scale = scales[in.ConsumeIntegralInRange(0, scale_choices - 1)];
  run.lse_base = in.ConsumeBool() ? LseBase::kE : LseBase::k2;
  const bool return_lse = in.ConsumeBool();
  p.use_fp16_qk_reduction = in.ConsumeIntegralInRange(0, 7) == 0;
  // Issue 11's variants (the tensors are made with the others below): attention sinks, FP8 scales
  // per head or per (token, head) — mostly on an FP8 cache with per-tensor scales 1, now and then
  // on another cache or with a per-tensor scale, which validation must refuse.
  p.use_sinks = in.ConsumeIntegralInRange(0, 3) == 0;
  const int granularity = in.ConsumeIntegralInRange(0, 5);
  if (granularity >= 4) {
    p.kv_scale_granularity =
        granularity == 4 ? KVScaleGranularity::kPerHead : KVScaleGranularity::kPerTokenHead;
    if (in.ConsumeIntegralInRange(0, 15) != 0) {
      run.k_scale = run.v_scale = 1.0f;
      if (!is_fp8(p.kv_dtype)) p.kv_dtype = in.ConsumeBool() ? DType::kE4M3 : DType::kE5M2;
    }
  }
  if (is_mla(p.op)) {
    // Mostly the valid MLA problem (16 or 32 heads, small latents, the fields MLA fixes derived,
    // sm_scale given, 16-bit q and o, none of the variants MLA does not define); now and then
    // the draws above stay and must be refused.
    const bool keep_broken = in.ConsumeIntegralInRange(0, 15) == 0;
    p.num_qo_heads = in.ConsumeBool() ? 16 : 32;
    p.head_dim_ckv = in.ConsumeIntegralInRange(1, kMaxHeadDim);
    p.head_dim_kpe = in.ConsumeIntegralInRange(1, kMaxHeadDim);
    if (!keep_broken) {
      derive_mla_fields(&p);
      if (!p.sm_scale) p.sm_scale = 0.25f;
      const DType q16[] = {DType::kBF16, DType::kF16};
      p.q_dtype = in.PickValueInArray(q16);
      p.o_dtype = in.ConsumeBool() ? p.q_dtype : DType::kF32;
      if (p.kv_dtype == DType::kF32) p.kv_dtype = DType::kBF16;
      if (p.mask_mode == MaskMode::kCustom) p.mask_mode = MaskMode::kCausal;
      p.window_left = -1;
      p.logits_soft_cap = 0.0f;
      p.pos_encoding_mode = PosEncoding::kNone;
      p.use_fp16_qk_reduction = false;
      run.q_scale = run.v_scale = 1.0f;
      p.use_sinks = false;  // MLA defines neither sinks nor scale granularity
      p.kv_scale_granularity = KVScaleGranularity::kPerTensor;
    }
  }

  const int requests = std::max(p.batch_size, 1);
  for (int b = 0; b < requests; ++b) {
    input->qo_lens.push_back(p.op == Op::kSingleDecode || p.op == Op::kBatchDecode
                                 ? 1
                                 : in.ConsumeIntegralInRange(0, kMaxQoLen));
    input->kv_lens.push_back(in.ConsumeIntegralInRange(0, kMaxKvLen));
  }
  if (!batch && p.op == Op::kSinglePrefill && input->qo_lens[0] == 0) input->qo_lens[0] = 1;

  Builder make(in, input);
  const float ranges[] = {1.0f, 4.0f, 30.0f};
  make.range_ = in.PickValueInArray(ranges);
  AttentionArgs& a = input->args;
  const int64_t hq = p.num_qo_heads, hk = p.num_kv_heads, dqk = p.head_dim_qk, dvo = p.head_dim_vo,
                ps = p.page_size;
  int64_t rows = 0, keys = 0;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last_page_len;
  int64_t pages_used = 0;
  for (int b = 0; b < p.batch_size; ++b) {
    rows += input->qo_lens[b];
    keys += input->kv_lens[b];
    qo_indptr.push_back(static_cast<int32_t>(rows));
    const int64_t pages = (input->kv_lens[b] + ps - 1) / ps;
    pages_used += pages;
    kv_indptr.push_back(static_cast<int32_t>(is_paged(p.op) || is_mla(p.op) ? pages_used : keys));
    last_page_len.push_back(pages ? static_cast<int32_t>(input->kv_lens[b] - (pages - 1) * ps) : 0);
  }
  if (!batch) {
    rows = input->qo_lens[0];
    keys = input->kv_lens[0];
  }
  const int64_t num_pages = pages_used + in.ConsumeIntegralInRange(0, 2);
  for (int64_t i = 0; i < pages_used; ++i) {
    kv_indices.push_back(
        static_cast<int32_t>(in.ConsumeIntegralInRange<int64_t>(0, num_pages - 1)));
  }
  // Corrupt one index entry now and then: validation must catch it, whatever it hits.
  if (in.ConsumeIntegralInRange(0, 15) == 0) {
    std::vector<int32_t>* tables[] = {&qo_indptr, &kv_indptr, &kv_indices, &last_page_len};
    std::vector<int32_t>& t = *tables[in.ConsumeIntegralInRange(0, 3)];
    if (!t.empty()) {
      t[in.ConsumeIntegralInRange<size_t>(0, t.size() - 1)] =
          in.ConsumeIntegralInRange<int32_t>(-3, static_cast<int32_t>(num_pages + 3));
    }
  }

  if (is_mla(p.op)) {
    const int64_t ckv = p.head_dim_ckv, kpe = p.head_dim_kpe;
    a.q_nope = make.tensor(p.q_dtype, {rows, hq, ckv}, false);
    a.q_pe = make.tensor(p.q_dtype, {rows, hq, kpe}, false);
    a.qo_indptr =
        make.tensor(DType::kI32, {static_cast<int64_t>(qo_indptr.size())}, false, &qo_indptr);
    a.ckv_cache = make.tensor(p.kv_dtype, {num_pages, ps, ckv}, false);
    a.kpe_cache = make.tensor(p.kv_dtype, {num_pages, ps, kpe}, false);
    a.kv_indptr =
        make.tensor(DType::kI32, {static_cast<int64_t>(kv_indptr.size())}, false, &kv_indptr);
    a.kv_indices =
        make.tensor(DType::kI32, {static_cast<int64_t>(kv_indices.size())}, false, &kv_indices);
    a.kv_last_page_len = make.tensor(DType::kI32, {static_cast<int64_t>(last_page_len.size())},
                                     false, &last_page_len);
  } else if (p.op == Op::kSingleDecode) {
    a.q = make.tensor(p.q_dtype, {hq, dqk}, false);
  } else {
    a.q = make.tensor(p.q_dtype, {rows, hq, dqk}, false);
  }
  if (p.op == Op::kBatchPrefillPaged || p.op == Op::kBatchPrefillRagged) {
    a.qo_indptr =
        make.tensor(DType::kI32, {static_cast<int64_t>(qo_indptr.size())}, false, &qo_indptr);
  }
  if (is_mla(p.op)) {
    // the latent caches are made with the queries above
  } else if (!batch) {
    const bool nhd = p.kv_layout == KVLayout::kNHD;
    a.k = nhd ? make.tensor(p.kv_dtype, {keys, hk, dqk}, false)
              : make.tensor(p.kv_dtype, {hk, keys, dqk}, false);
    a.v = nhd ? make.tensor(p.kv_dtype, {keys, hk, dvo}, false)
              : make.tensor(p.kv_dtype, {hk, keys, dvo}, false);
  } else if (p.op == Op::kBatchPrefillRagged) {
    a.k = make.tensor(p.kv_dtype, {keys, hk, dqk}, false);
    a.v = make.tensor(p.kv_dtype, {keys, hk, dvo}, false);
    a.kv_indptr =
        make.tensor(DType::kI32, {static_cast<int64_t>(kv_indptr.size())}, false, &kv_indptr);
  } else {
    const bool nhd = p.kv_layout == KVLayout::kNHD;
    a.paged_k_cache = nhd ? make.tensor(p.kv_dtype, {num_pages, ps, hk, dqk}, false)
                          : make.tensor(p.kv_dtype, {num_pages, hk, ps, dqk}, false);
    a.paged_v_cache = nhd ? make.tensor(p.kv_dtype, {num_pages, ps, hk, dvo}, false)
                          : make.tensor(p.kv_dtype, {num_pages, hk, ps, dvo}, false);
    a.kv_indptr =
        make.tensor(DType::kI32, {static_cast<int64_t>(kv_indptr.size())}, false, &kv_indptr);
    a.kv_indices =
        make.tensor(DType::kI32, {static_cast<int64_t>(kv_indices.size())}, false, &kv_indices);
    a.kv_last_page_len = make.tensor(DType::kI32, {static_cast<int64_t>(last_page_len.size())},
                                     false, &last_page_len);
  }
  if (p.mask_mode == MaskMode::kCustom) {
    a.custom_mask_packed = in.ConsumeBool();
    int64_t mask_bytes = 0;
    for (int b = 0; b < requests; ++b) {
      const int64_t entries = input->qo_lens[b] * input->kv_lens[b];
      mask_bytes += a.custom_mask_packed ? (entries + 7) / 8 : entries;
    }
    a.custom_mask = make.tensor(DType::kU8, {mask_bytes}, false);
    // Random bytes make a valid packed mask; an unpacked one needs 0/1 bytes.
    if (!a.custom_mask_packed) {
      Buffer& mb = input->buffers.back();
      for (uint8_t& byte : mb.bytes) byte &= 1;
    }
  }
  if (p.pos_encoding_mode == PosEncoding::kAlibi && in.ConsumeBool()) {
    a.alibi_slopes = make.tensor(DType::kF32, {hq}, false);
  }
  const int64_t out_rows = p.op == Op::kSingleDecode ? 0 : rows;
  a.out = p.op == Op::kSingleDecode ? make.tensor(p.o_dtype, {hq, dvo}, true)
                                    : make.tensor(p.o_dtype, {out_rows, hq, dvo}, true);
  if (return_lse) {
    a.lse = p.op == Op::kSingleDecode ? make.tensor(DType::kF32, {hq}, true)
                                      : make.tensor(DType::kF32, {out_rows, hq}, true);
  }
  // The tensors of issue 11's variants: positive finite scales, now and then a missing tensor or
  // one bad value that validation must refuse.
  auto positive = [&](const TensorView& t) {
    Buffer& b = input->buffers.back();
    auto* f = reinterpret_cast<float*>(b.bytes.data());
    const size_t n = b.bytes.size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) f[i] = std::fabs(f[i]) + 0.05f;
    if (n > 0 && in.ConsumeIntegralInRange(0, 15) == 0) {
      const float bad[] = {0.0f, -1.0f, NAN, INFINITY};
      f[in.ConsumeIntegralInRange<size_t>(0, n - 1)] = in.PickValueInArray(bad);
    }
    return t;
  };
  if (p.use_sinks && in.ConsumeIntegralInRange(0, 15) != 0) {
    a.sinks = make.tensor(DType::kF32, {hq}, false);
  }
  if (granularity >= 4) {
    const bool given = in.ConsumeIntegralInRange(0, 15) != 0;
    for (TensorView* t :
         granularity == 4
             ? std::initializer_list<TensorView*>{&a.k_scale, &a.v_scale}
             : std::initializer_list<TensorView*>{&a.k_scale_cache, &a.v_scale_cache}) {
      if (!given) break;
      if (granularity == 4) {
        *t = positive(make.tensor(DType::kF32, {hk}, false));
      } else if (is_paged(p.op)) {
        *t = positive(make.tensor(DType::kF32, {num_pages, ps, hk}, false));
      } else {
        *t = positive(make.tensor(DType::kF32, {keys, hk}, false));
      }
    }
  }
  // Occasionally one structural break of the args: a dim off by one, a dtype swapped, an output
  // aliasing an input.
  switch (in.ConsumeIntegralInRange(0, 23)) {
    case 0: {
      TensorView& q = is_mla(p.op) ? (in.ConsumeBool() ? a.q_nope : a.q_pe) : a.q;
      q.shape[q.rank - 1] += in.ConsumeBool() ? 1 : -1;  // MLA: a wrong latent width
      break;
    }
    case 1:
      a.out.dtype = in.PickValueInArray(kFloatTypes);
      break;
    case 2: {
      // out at an input's first byte: an overlap validation must refuse. Not an input without
      // elements: nothing is shared then (the call is valid), and out's buffer_bytes would claim
      // the few bytes of slack behind it as its own (the reference wrote past them, an ASan
      // finding of the harness, not of kvattn).
      const TensorView& input = is_mla(p.op) ? a.ckv_cache : a.q;
      if (input.numel() > 0) a.out.data = input.data;
      break;
    }
    case 3:
      a.out.strides[0] = 0;
      break;
    case 4:
      std::swap(a.out, a.lse);
      break;
    default:
      break;
  }

  input->cpu_options.backend = "cpu";
  input->cpu_options.num_threads = in.ConsumeIntegralInRange(1, 2);
  input->cpu_options.kv_chunk_size = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange(1, 8);
}

// Contiguous f32 views of an attention output / LSE for the reference and the baseline.
TensorView out_view(const Problem& p, int64_t rows, void* data, DType dtype) {
  if (p.op == Op::kSingleDecode) {
    return TensorView::contiguous(data, dtype, {p.num_qo_heads, p.head_dim_vo});
  }
  return TensorView::contiguous(data, dtype, {rows, p.num_qo_heads, p.head_dim_vo});
}
TensorView lse_view(const Problem& p, int64_t rows, float* data) {
  if (p.op == Op::kSingleDecode) return TensorView::contiguous(data, DType::kF32, {p.num_qo_heads});
  return TensorView::contiguous(data, DType::kF32, {rows, p.num_qo_heads});
}

double max_abs(const TensorView& t) {
  double m = 0.0;
  for (float x : testing::view_to_f32(t)) {
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  }
  return m;
}

// Score widenings of the tolerance rule (testing/tolerance.cc explains the fp16 one):
// - fp16 QK reduction may move each score by one f16 step: delta = 2^-10 D max|q| max|k| sm_scale;
// - a score held in f32 is only known to an ulp of itself, and kernels that fold
//   sm_scale * log2(e) into exp2 round once more: delta = 2^-23 max|s|. The baseline does not show
//   it when its scores happen to be exact. A soft cap does not shrink that: the f32 dot product
//   before the cap is known to an ulp of its terms (q.k of 0 from terms of 6e3 is off by ~1e-4),
//   and c tanh(x / c) passes an error in x on with a slope <= 1, so max|s| is the uncapped bound
//   (a fuzzer finding: the AVX2 prefill's FMA dot product cancelling to 2e-4, LSE off by 6.5e-5
//   against a bound of 6.3e-5 computed with max|s| = the cap 0.5).
// Scores moved by delta move the LSE by <= delta and the output by <= 2 delta max|v|.
testing::ScoreWidening score_widening(const Problem& p, const AttentionArgs& a) {
  const bool paged = is_paged(p.op), mla = is_mla(p.op);
  const double max_q =
      (mla ? std::max(max_abs(a.q_nope), max_abs(a.q_pe)) : max_abs(a.q)) * a.scalars.q_scale;
  // Per-head / per-(token, head) scales bound the real K and V by their largest value.
  const double k_scale = !a.k_scale.empty()         ? max_abs(a.k_scale)
                         : !a.k_scale_cache.empty() ? max_abs(a.k_scale_cache)
                                                    : a.scalars.k_scale;
  const double v_scale = !a.v_scale.empty()         ? max_abs(a.v_scale)
                         : !a.v_scale_cache.empty() ? max_abs(a.v_scale_cache)
                                                    : a.scalars.v_scale;
  const double max_k = (mla ? std::max(max_abs(a.ckv_cache), max_abs(a.kpe_cache))
                            : max_abs(paged ? a.paged_k_cache : a.k)) *
                       k_scale;
  const double max_v = mla ? max_abs(a.ckv_cache) * a.scalars.k_scale
                           : max_abs(paged ? a.paged_v_cache : a.v) * v_scale;
  const double max_qk = p.head_dim_qk * max_q * max_k * p.effective_sm_scale();
  double max_score = max_qk;
  if (p.pos_encoding_mode == PosEncoding::kAlibi) {
    // |slope| <= 1 for the standard slopes; distances stay below kMaxKvLen.
    const double slope = a.alibi_slopes.empty() ? 1.0 : max_abs(a.alibi_slopes);
    max_score += slope * kMaxKvLen;
  }
  double delta = std::ldexp(max_score, -23);
  if (p.use_fp16_qk_reduction) delta += std::ldexp(max_qk, -10);
  return {2.0 * delta * max_v, delta};
}

void check(const Input& input) {
  const Problem& p = input.problem;
  const AttentionArgs& args = input.args;
  // run(problem, args) plans first (plan scope: data tensors may be absent, PlanFromIndexTensors)
  // and then validates everything: its first refusal is the plan scope's, else the run scope's.
  Status valid = validate_attention(p, args, ArgsScope::kPlan);
  if (valid.ok()) valid = validate_attention(p, args);

  PlanOptions ref_options;
  ref_options.backend = "reference";
  const Status ran = kvattn::run(p, args, ref_options);
  if (!valid.ok()) {
    if (ran.ok() || ran.code() != valid.code())
      finding("run disagrees with validation", valid, ran, p);
    return;
  }
  if (!ran.ok()) finding("reference failed on a validated call", valid, ran, p);

  // The reference again, unrounded into contiguous f32 with its LSE, and the baseline: the
  // tolerance rule of testing/tolerance.h.
  const int64_t total_qo =
      p.op == Op::kSingleDecode ? 1 : (is_mla(p.op) ? args.q_nope : args.q).shape[0];
  const int64_t rows = total_qo * p.num_qo_heads;
  Problem ref_problem = p;
  ref_problem.o_dtype = DType::kF32;
  std::vector<float> ref_out(static_cast<size_t>(rows * p.head_dim_vo)), ref_lse(rows);
  AttentionArgs ref_args = args;
  ref_args.out = out_view(p, total_qo, ref_out.data(), DType::kF32);
  ref_args.lse = lse_view(p, total_qo, ref_lse.data());
  Status st = kvattn::run(ref_problem, ref_args, ref_options);
  if (!st.ok()) finding("reference (f32 out) failed on a validated call", valid, st, p);

  const Backend* cpu = find_backend("cpu");
  if (!cpu || !cpu->can_implement(p, Device::cpu()).ok() || !cpu->available(Device::cpu()).ok()) {
    return;
  }
  const Problem& baseline_problem = p;
  std::vector<uint8_t> baseline_raw(static_cast<size_t>(rows * p.head_dim_vo) *
                                    dtype_size(p.o_dtype));
  std::vector<float> baseline_out(ref_out.size()), baseline_lse(rows);
  AttentionArgs baseline_args = args;
  baseline_args.out = out_view(p, total_qo, baseline_raw.data(), p.o_dtype);
  baseline_args.lse = lse_view(p, total_qo, baseline_lse.data());
  st = testing::baseline_attention(baseline_problem, baseline_args);
  if (!st.ok()) finding("baseline failed on a validated call", valid, st, p);
  testing::to_f32(baseline_raw.data(), p.o_dtype, static_cast<int64_t>(baseline_out.size()),
                  baseline_out.data());

  // The cpu backend writes the fuzzed (possibly strided) outputs themselves.
  const Status cpu_ran = kvattn::run(p, args, input.cpu_options);
  if (!cpu_ran.ok()) return;  // a backend may decline a call it cannot do yet; never a crash
  // Values the generator does not bound can overflow on the way (e.g. fp16 QK reduction: scores
  // past 65504 at range 30 with per-(token, head) K scales): the reference's output is then not
  // finite and the tolerance rule has nothing to compare with (testing/tolerance.h: "bad
  // input"). Such a call must still run without a crash (above); the NaN policy has its own tests.
  for (const float x : ref_out) {
    if (!std::isfinite(x)) return;
  }
  const std::vector<float> got_out = testing::view_to_f32(args.out);
  const std::vector<float> got_lse =
      !args.lse.empty() ? testing::view_to_f32(args.lse) : std::vector<float>{};
  const testing::CheckResult r =
      testing::compare_with_reference(p, rows, ref_out, ref_lse, baseline_out, baseline_lse,
                                      got_out, got_lse, score_widening(p, args));
  if (!r.ok) {
    std::fprintf(stderr, "FINDING: cpu differs from the reference\n%s\nproblem: %s\n",
                 r.message.c_str(), p.to_string().c_str());
    std::abort();
  }
}

}  // namespace
}  // namespace kvattn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  kvattn::fuzz::Input input;
  kvattn::fuzz::build(in, &input);
  kvattn::fuzz::check(input);
  return 0;
}
