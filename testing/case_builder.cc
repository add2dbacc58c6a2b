#include "testing/case_builder.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>

#include "core/numeric.h"

namespace kvattn::testing {
namespace {

// Unused cache slots and pool pages hold NaN: a kernel that reads past a request's keys, or
// multiplies masked garbage by a zero probability, shows up as NaN in its output.
constexpr float kGarbage = NAN;

void fill_random(std::vector<std::byte>* buf, DType dtype, int64_t n, float range,
                 std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = dist(rng);
  buf->resize(static_cast<std::size_t>(n) * dtype_size(dtype));
  from_f32(values.data(), n, dtype, buf->data());
}

void fill_value(std::vector<std::byte>* buf, DType dtype, int64_t n, float value) {
  std::vector<float> values(static_cast<std::size_t>(n), value);
  buf->resize(static_cast<std::size_t>(n) * dtype_size(dtype));
  from_f32(values.data(), n, dtype, buf->data());
}

TensorView view(std::vector<std::byte>& buf, DType dtype, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(buf.data(), dtype, shape);
}

template <class T>
TensorView index_view(std::vector<T>& v) {
  return TensorView::contiguous(v.data(), DType::kI32, {static_cast<int64_t>(v.size())});
}

}  // namespace

void to_f32(const void* data, DType dtype, int64_t n, float* out) {
  const auto* p8 = static_cast<const uint8_t*>(data);
  const auto* p16 = static_cast<const uint16_t*>(data);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: out[i] = static_cast<const float*>(data)[i]; break;
      case DType::kF16: out[i] = num::f16_to_f32(p16[i]); break;
      case DType::kBF16: out[i] = num::bf16_to_f32(p16[i]); break;
      case DType::kE4M3: out[i] = num::e4m3_to_f32(p8[i]); break;
      case DType::kE5M2: out[i] = num::e5m2_to_f32(p8[i]); break;
      case DType::kI32: out[i] = static_cast<float>(static_cast<const int32_t*>(data)[i]); break;
      case DType::kU8: out[i] = p8[i]; break;
    }
  }
}

void from_f32(const float* in, int64_t n, DType dtype, void* data) {
  auto* p8 = static_cast<uint8_t*>(data);
  auto* p16 = static_cast<uint16_t*>(data);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: static_cast<float*>(data)[i] = in[i]; break;
      case DType::kF16: p16[i] = num::f32_to_f16(in[i]); break;
      case DType::kBF16: p16[i] = num::f32_to_bf16(in[i]); break;
      case DType::kE4M3: p8[i] = num::f32_to_e4m3(in[i]); break;
      case DType::kE5M2: p8[i] = num::f32_to_e5m2(in[i]); break;
      case DType::kI32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(in[i]); break;
      case DType::kU8: p8[i] = static_cast<uint8_t>(in[i]); break;
    }
  }
}

std::vector<float> view_to_f32(const TensorView& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  if (out.empty()) return out;
  std::array<int64_t, kMaxRank> idx{};
  const std::size_t esize = dtype_size(t.dtype);
  for (std::size_t n = 0; n < out.size(); ++n) {
    int64_t offset = 0;
    for (int d = 0; d < t.rank; ++d) offset += idx[d] * t.strides[d];
    to_f32(static_cast<const std::byte*>(t.data) + offset * static_cast<int64_t>(esize), t.dtype,
           1, &out[n]);
    for (int d = t.rank - 1; d >= 0; --d) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

Case Case::make(const CaseSpec& spec) {
  Case c;
  c.spec_ = spec;
  const Problem& p = spec.problem;
  std::mt19937_64 rng(spec.seed);
  const int batch = is_batch(p.op) ? p.batch_size : 1;
  if (static_cast<int>(spec.kv_lens.size()) != batch) {
    throw std::invalid_argument("CaseSpec: kv_lens must have one entry per request");
  }
  c.kv_lens_ = spec.kv_lens;
  if (is_decode(p.op)) {
    c.qo_lens_.assign(batch, 1);
  } else if (spec.qo_lens.empty()) {
    c.qo_lens_ = spec.kv_lens;
  } else {
    if (static_cast<int>(spec.qo_lens.size()) != batch) {
      throw std::invalid_argument("CaseSpec: qo_lens must have one entry per request");
    }
    c.qo_lens_ = spec.qo_lens;
  }
  c.total_qo_ = std::accumulate(c.qo_lens_.begin(), c.qo_lens_.end(), int64_t{0});
  c.total_kv_ = std::accumulate(c.kv_lens_.begin(), c.kv_lens_.end(), int64_t{0});

  if (is_mla(p.op)) {
    c.make_mla_inputs(rng);
    return c;
  }
  const int64_t hq = p.num_qo_heads, hk = p.num_kv_heads;
  const int64_t dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  fill_random(&c.q, p.q_dtype, c.total_qo_ * hq * dqk, spec.value_range, rng);

  if (is_batch(p.op)) {
    c.qo_indptr.assign(batch + 1, 0);
    for (int b = 0; b < batch; ++b) {
      c.qo_indptr[b + 1] = c.qo_indptr[b] + static_cast<int32_t>(c.qo_lens_[b]);
    }
  }

  if (p.op == Op::kSingleDecode || p.op == Op::kSinglePrefill ||
      p.op == Op::kBatchPrefillRagged) {
    // Contiguous K/V: values are random; layout NHD or (single ops only) HND.
    fill_random(&c.k, p.kv_dtype, c.total_kv_ * hk * dqk, spec.value_range, rng);
    fill_random(&c.v, p.kv_dtype, c.total_kv_ * hk * dvo, spec.value_range, rng);
    if (p.op == Op::kBatchPrefillRagged) {
      c.kv_indptr.assign(batch + 1, 0);
      for (int b = 0; b < batch; ++b) {
        c.kv_indptr[b + 1] = c.kv_indptr[b] + static_cast<int32_t>(c.kv_lens_[b]);
      }
    }
  } else {
    // Paged: each request gets ceil(len / page_size) pages from a shuffled pool.
    const int64_t ps = p.page_size;
    std::vector<int64_t> pages_per_request(batch);
    int64_t used_pages = 0;
    for (int b = 0; b < batch; ++b) {
      pages_per_request[b] = (c.kv_lens_[b] + ps - 1) / ps;
      used_pages += pages_per_request[b];
    }
    c.num_pages = used_pages + spec.extra_pages;
    std::vector<int32_t> pool(static_cast<std::size_t>(c.num_pages));
    std::iota(pool.begin(), pool.end(), 0);
    if (spec.shuffle_pages) std::shuffle(pool.begin(), pool.end(), rng);
    c.kv_indptr.assign(batch + 1, 0);
    c.kv_last_page_len.assign(batch, 0);
    for (int b = 0; b < batch; ++b) {
      c.kv_indptr[b + 1] = c.kv_indptr[b] + static_cast<int32_t>(pages_per_request[b]);
      int64_t last = c.kv_lens_[b] - (pages_per_request[b] - 1) * ps;
      c.kv_last_page_len[b] = pages_per_request[b] ? static_cast<int32_t>(last) : 0;
    }
    c.kv_indices.assign(pool.begin(), pool.begin() + used_pages);

    // Every slot starts as garbage; the slots of real tokens get random values.
    const int64_t page_k = ps * hk * dqk, page_v = ps * hk * dvo;
    const bool combined = spec.combined_kv_cache && dqk == dvo;
    std::vector<std::byte>& kbuf = combined ? c.kv_cache : c.k_cache;
    const int64_t esize = static_cast<int64_t>(dtype_size(p.kv_dtype));
    if (combined) {
      fill_value(&c.kv_cache, p.kv_dtype, c.num_pages * 2 * page_k, kGarbage);
    } else {
      fill_value(&c.k_cache, p.kv_dtype, c.num_pages * page_k, kGarbage);
      fill_value(&c.v_cache, p.kv_dtype, c.num_pages * page_v, kGarbage);
    }
    std::byte* k_base = kbuf.data();
    std::byte* v_base = combined ? c.kv_cache.data() + page_k * esize : c.v_cache.data();
    const int64_t k_page_stride = combined ? 2 * page_k : page_k;
    const int64_t v_page_stride = combined ? 2 * page_k : page_v;
    std::vector<std::byte> row;
    for (int b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < c.kv_lens_[b]; ++t) {
        int64_t page = c.kv_indices[c.kv_indptr[b] + t / ps];
        int64_t slot = t % ps;
        for (int64_t h = 0; h < hk; ++h) {
          int64_t k_off = p.kv_layout == KVLayout::kNHD ? (slot * hk + h) * dqk
                                                        : (h * ps + slot) * dqk;
          int64_t v_off = p.kv_layout == KVLayout::kNHD ? (slot * hk + h) * dvo
                                                        : (h * ps + slot) * dvo;
          fill_random(&row, p.kv_dtype, dqk, spec.value_range, rng);
          std::memcpy(k_base + (page * k_page_stride + k_off) * esize, row.data(), row.size());
          fill_random(&row, p.kv_dtype, dvo, spec.value_range, rng);
          std::memcpy(v_base + (page * v_page_stride + v_off) * esize, row.data(), row.size());
        }
      }
    }
  }

  if (p.mask_mode == MaskMode::kCustom) {
    std::bernoulli_distribution bit(spec.custom_mask_density);
    std::vector<uint8_t> bytes;
    for (int b = 0; b < batch; ++b) {
      int64_t n = c.qo_lens_[b] * c.kv_lens_[b];
      if (spec.packed_custom_mask) {
        std::vector<uint8_t> packed(static_cast<std::size_t>((n + 7) / 8), 0);
        for (int64_t i = 0; i < n; ++i) {
          if (bit(rng)) packed[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
        }
        bytes.insert(bytes.end(), packed.begin(), packed.end());
      } else {
        for (int64_t i = 0; i < n; ++i) bytes.push_back(bit(rng) ? 1 : 0);
      }
    }
    c.custom_mask.resize(bytes.size());
    if (!bytes.empty()) std::memcpy(c.custom_mask.data(), bytes.data(), bytes.size());
  }
  // Drawn last so that cases without them keep the values they always had.
  if (p.use_sinks) fill_random(&c.sinks, DType::kF32, hq, spec.sink_range, rng);
  auto scale = [&](std::vector<std::byte>* buf, int64_t n) {
    std::uniform_real_distribution<float> dist(spec.scale_min, spec.scale_max);
    std::vector<float> values(static_cast<std::size_t>(n));
    for (float& x : values) x = dist(rng);
    buf->resize(values.size() * sizeof(float));
    if (n > 0) std::memcpy(buf->data(), values.data(), buf->size());
  };
  if (p.kv_scale_granularity == KVScaleGranularity::kPerHead) {
    scale(&c.k_scale, hk);
    scale(&c.v_scale, hk);
  }
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    if (is_paged(p.op)) {
      // Slots of real tokens get scales; the rest (and unused pages) garbage.
      const int64_t ps = p.page_size;
      for (auto* buf : {&c.k_scale_cache, &c.v_scale_cache}) {
        fill_value(buf, DType::kF32, c.num_pages * ps * hk, kGarbage);
        std::vector<std::byte> row;
        auto* f = reinterpret_cast<float*>(buf->data());
        for (int b = 0; b < batch; ++b) {
          for (int64_t t = 0; t < c.kv_lens_[b]; ++t) {
            const int64_t page = c.kv_indices[c.kv_indptr[b] + t / ps];
            scale(&row, hk);
            std::memcpy(f + (page * ps + t % ps) * hk, row.data(), row.size());
          }
        }
      }
    } else {
      scale(&c.k_scale_cache, c.total_kv_ * hk);
      scale(&c.v_scale_cache, c.total_kv_ * hk);
    }
  }
  return c;
}

// MLA: q_nope, q_pe, and the paged latent caches (ckv in k_cache, kpe in v_cache) with the
// same shuffled page table and garbage-filled unused slots as the other paged ops.
void Case::make_mla_inputs(std::mt19937_64& rng) {
  const Problem& p = spec_.problem;
  const int batch = p.batch_size;
  const int64_t hq = p.num_qo_heads, d_ckv = p.head_dim_ckv, d_kpe = p.head_dim_kpe;
  const float range = spec_.value_range;
  fill_random(&q, p.q_dtype, total_qo_ * hq * d_ckv, range, rng);
  fill_random(&q_pe, p.q_dtype, total_qo_ * hq * d_kpe, range, rng);
  qo_indptr.assign(batch + 1, 0);
  for (int b = 0; b < batch; ++b) qo_indptr[b + 1] = qo_indptr[b] + int32_t(qo_lens_[b]);
  const int64_t ps = p.page_size;
  std::vector<int64_t> pages(batch);
  int64_t used = 0;
  for (int b = 0; b < batch; ++b) used += pages[b] = (kv_lens_[b] + ps - 1) / ps;
  num_pages = used + spec_.extra_pages;
  std::vector<int32_t> pool(static_cast<std::size_t>(num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  if (spec_.shuffle_pages) std::shuffle(pool.begin(), pool.end(), rng);
  kv_indptr.assign(batch + 1, 0);
  kv_last_page_len.assign(batch, 0);
  for (int b = 0; b < batch; ++b) {
    kv_indptr[b + 1] = kv_indptr[b] + static_cast<int32_t>(pages[b]);
    kv_last_page_len[b] = pages[b] ? static_cast<int32_t>(kv_lens_[b] - (pages[b] - 1) * ps) : 0;
  }
  kv_indices.assign(pool.begin(), pool.begin() + used);
  fill_value(&k_cache, p.kv_dtype, num_pages * ps * d_ckv, kGarbage);
  fill_value(&v_cache, p.kv_dtype, num_pages * ps * d_kpe, kGarbage);
  const auto esize = static_cast<int64_t>(dtype_size(p.kv_dtype));
  std::vector<std::byte> row;
  for (int b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < kv_lens_[b]; ++t) {
      const int64_t slot = int64_t{kv_indices[kv_indptr[b] + t / ps]} * ps + t % ps;
      fill_random(&row, p.kv_dtype, d_ckv, range, rng);
      std::memcpy(k_cache.data() + slot * d_ckv * esize, row.data(), row.size());
      fill_random(&row, p.kv_dtype, d_kpe, range, rng);
      std::memcpy(v_cache.data() + slot * d_kpe * esize, row.data(), row.size());
    }
  }
}

AttentionArgs Case::inputs() const {
  // Views into owned buffers; const_cast because views are mutable handles by design.
  auto& self = const_cast<Case&>(*this);
  const Problem& p = spec_.problem;
  if (is_mla(p.op)) {
    AttentionArgs a;
    const int64_t hq = p.num_qo_heads, ps = p.page_size;
    a.q_nope = view(self.q, p.q_dtype, {total_qo_, hq, p.head_dim_ckv});
    a.q_pe = view(self.q_pe, p.q_dtype, {total_qo_, hq, p.head_dim_kpe});
    a.ckv_cache = view(self.k_cache, p.kv_dtype, {num_pages, ps, p.head_dim_ckv});
    a.kpe_cache = view(self.v_cache, p.kv_dtype, {num_pages, ps, p.head_dim_kpe});
    a.qo_indptr = index_view(self.qo_indptr);
    a.kv_indptr = index_view(self.kv_indptr);
    a.kv_indices = index_view(self.kv_indices);
    a.kv_last_page_len = index_view(self.kv_last_page_len);
    return a;
  }
  const int64_t hq = p.num_qo_heads, hk = p.num_kv_heads;
  const int64_t dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const int batch = is_batch(p.op) ? p.batch_size : 1;
  AttentionArgs a;
  switch (p.op) {
    case Op::kSingleDecode: a.q = view(self.q, p.q_dtype, {hq, dqk}); break;
    case Op::kBatchDecode: a.q = view(self.q, p.q_dtype, {batch, hq, dqk}); break;
    default: a.q = view(self.q, p.q_dtype, {total_qo_, hq, dqk}); break;
  }
  if (is_batch(p.op) && !is_decode(p.op)) a.qo_indptr = index_view(self.qo_indptr);
  const int64_t kv = total_kv_;
  if (p.op == Op::kSingleDecode || p.op == Op::kSinglePrefill) {
    if (p.kv_layout == KVLayout::kNHD) {
      a.k = view(self.k, p.kv_dtype, {kv, hk, dqk});
      a.v = view(self.v, p.kv_dtype, {kv, hk, dvo});
    } else {
      a.k = view(self.k, p.kv_dtype, {hk, kv, dqk});
      a.v = view(self.v, p.kv_dtype, {hk, kv, dvo});
    }
  } else if (p.op == Op::kBatchPrefillRagged) {
    a.k = view(self.k, p.kv_dtype, {kv, hk, dqk});
    a.v = view(self.v, p.kv_dtype, {kv, hk, dvo});
    a.kv_indptr = index_view(self.kv_indptr);
  } else {
    const int64_t ps = p.page_size, np = num_pages;
    const bool nhd = p.kv_layout == KVLayout::kNHD;
    if (!kv_cache.empty()) {
      // Combined [P, 2, ...]: K and V are strided views of one buffer.
      const int64_t page = ps * hk * dqk;
      const int64_t shape[4] = {np, nhd ? ps : hk, nhd ? hk : ps, dqk};
      const int64_t strides[4] = {2 * page, nhd ? hk * dqk : ps * dqk, dqk, 1};
      const int64_t bytes = static_cast<int64_t>(self.kv_cache.size());
      const int64_t esize = static_cast<int64_t>(dtype_size(p.kv_dtype));
      a.paged_k_cache = TensorView::strided(self.kv_cache.data(), p.kv_dtype, shape, strides, 4,
                                            bytes);
      a.paged_v_cache = TensorView::strided(self.kv_cache.data() + page * esize, p.kv_dtype,
                                            shape, strides, 4, bytes - page * esize);
    } else {
      a.paged_k_cache = nhd ? view(self.k_cache, p.kv_dtype, {np, ps, hk, dqk})
                            : view(self.k_cache, p.kv_dtype, {np, hk, ps, dqk});
      a.paged_v_cache = nhd ? view(self.v_cache, p.kv_dtype, {np, ps, hk, dvo})
                            : view(self.v_cache, p.kv_dtype, {np, hk, ps, dvo});
    }
    a.kv_indptr = index_view(self.kv_indptr);
    a.kv_indices = index_view(self.kv_indices);
    a.kv_last_page_len = index_view(self.kv_last_page_len);
  }
  if (p.mask_mode == MaskMode::kCustom) {
    a.custom_mask = view(self.custom_mask, DType::kU8,
                         {static_cast<int64_t>(self.custom_mask.size())});
    a.custom_mask_packed = spec_.packed_custom_mask;
  }
  if (p.use_sinks) a.sinks = view(self.sinks, DType::kF32, {hq});
  if (p.kv_scale_granularity == KVScaleGranularity::kPerHead) {
    a.k_scale = view(self.k_scale, DType::kF32, {hk});
    a.v_scale = view(self.v_scale, DType::kF32, {hk});
  }
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    if (is_paged(p.op)) {
      a.k_scale_cache = view(self.k_scale_cache, DType::kF32, {num_pages, p.page_size, hk});
      a.v_scale_cache = view(self.v_scale_cache, DType::kF32, {num_pages, p.page_size, hk});
    } else {
      a.k_scale_cache = view(self.k_scale_cache, DType::kF32, {total_kv_, hk});
      a.v_scale_cache = view(self.v_scale_cache, DType::kF32, {total_kv_, hk});
    }
  }
  return a;
}

namespace {

void make_outputs(const Problem& p, int64_t total_qo, DType o_dtype, bool return_lse, bool nan_fill,
                  std::vector<std::byte>* out, std::vector<std::byte>* lse, AttentionArgs* a) {
  const int64_t hq = p.num_qo_heads, dvo = p.head_dim_vo;
  fill_value(out, o_dtype, total_qo * hq * dvo, nan_fill ? NAN : 0.0f);
  if (p.op == Op::kSingleDecode) {
    a->out = view(*out, o_dtype, {hq, dvo});
  } else {
    a->out = view(*out, o_dtype, {total_qo, hq, dvo});
  }
  if (return_lse) {
    fill_value(lse, DType::kF32, total_qo * hq, nan_fill ? NAN : 0.0f);
    a->lse = p.op == Op::kSingleDecode ? view(*lse, DType::kF32, {hq})
                                       : view(*lse, DType::kF32, {total_qo, hq});
  } else {
    lse->clear();
  }
}

}  // namespace

AttentionArgs Case::args() {
  AttentionArgs a = inputs();
  a.scalars = spec_.scalars;
  make_outputs(spec_.problem, total_qo_, spec_.problem.o_dtype, spec_.return_lse,
               spec_.nan_fill_outputs, &out, &lse, &a);
  return a;
}

AttentionArgs Case::args_with_fresh_outputs(DType o_dtype) {
  AttentionArgs a = inputs();
  a.scalars = spec_.scalars;
  make_outputs(spec_.problem, total_qo_, o_dtype, spec_.return_lse, spec_.nan_fill_outputs,
               &fresh_out, &fresh_lse, &a);
  fresh_o_dtype_ = o_dtype;
  return a;
}

std::vector<float> Case::out_f32() const {
  std::vector<float> r(out.size() / dtype_size(spec_.problem.o_dtype));
  to_f32(out.data(), spec_.problem.o_dtype, static_cast<int64_t>(r.size()), r.data());
  return r;
}
std::vector<float> Case::lse_f32() const {
  std::vector<float> r(lse.size() / 4);
  std::memcpy(r.data(), lse.data(), lse.size());
  return r;
}
std::vector<float> Case::fresh_out_f32() const {
  std::vector<float> r(fresh_out.size() / dtype_size(fresh_o_dtype_));
  to_f32(fresh_out.data(), fresh_o_dtype_, static_cast<int64_t>(r.size()), r.data());
  return r;
}
std::vector<float> Case::fresh_lse_f32() const {
  std::vector<float> r(fresh_lse.size() / 4);
  std::memcpy(r.data(), fresh_lse.data(), fresh_lse.size());
  return r;
}

int64_t Case::bytes_moved() const {
  const Problem& p = spec_.problem;
  const int64_t kv_bytes = static_cast<int64_t>(dtype_size(p.kv_dtype));
  int64_t bytes =
      total_qo_ * p.num_qo_heads * p.head_dim_qk * static_cast<int64_t>(dtype_size(p.q_dtype));
  // MLA reads each latent (ckv + kpe = head_dim_qk) once: the values are the ckv it already read.
  bytes += total_kv_ * p.num_kv_heads *
           (is_mla(p.op) ? p.head_dim_qk : p.head_dim_qk + p.head_dim_vo) * kv_bytes;
  bytes += total_qo_ * p.num_qo_heads * p.head_dim_vo * static_cast<int64_t>(dtype_size(p.o_dtype));
  if (spec_.return_lse) bytes += total_qo_ * p.num_qo_heads * 4;
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    bytes += total_kv_ * p.num_kv_heads * 2 * 4;
  }
  return bytes;
}

double Case::flops() const {
  const Problem& p = spec_.problem;
  double total = 0;
  for (std::size_t b = 0; b < kv_lens_.size(); ++b) {
    double lq = static_cast<double>(qo_lens_[b]), lkv = static_cast<double>(kv_lens_[b]);
    double pairs = p.mask_mode == MaskMode::kCausal ? std::max(0.0, (2 * lkv - lq) * lq)
                                                    : 2 * lq * lkv;
    total += pairs * p.num_qo_heads * (p.head_dim_qk + p.head_dim_vo);
  }
  return total;
}

}  // namespace kvattn::testing
