// Operations that are not attention, multithreaded over rows. The arithmetic is the reference's
// (fp64, values rounded once to the output dtype) so that results match it bit for bit; the
// work is memory-bound, so the wider math costs nothing measurable.
#include "cpu/aux_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "core/paged_kv.h"
#include "core/rope_host.h"
#include "core/status_macros.h"
#include "cpu/thread_pool.h"

namespace kvattn::cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// Rows handed to a thread at a time: enough to amortize the hand-out, few enough to balance.
constexpr int64_t kRowsPerItem = 16;

double load(const TensorView& t, int64_t offset) {
  switch (t.dtype) {
    case DType::kF32:
      return t.as<const float>()[offset];
    case DType::kF16:
      return num::f16_to_f32(t.as<const uint16_t>()[offset]);
    case DType::kBF16:
      return num::bf16_to_f32(t.as<const uint16_t>()[offset]);
    case DType::kE4M3:
      return num::e4m3_to_f32(t.as<const uint8_t>()[offset]);
    case DType::kE5M2:
      return num::e5m2_to_f32(t.as<const uint8_t>()[offset]);
    case DType::kI32:
      return t.as<const int32_t>()[offset];
    case DType::kU8:
      return t.as<const uint8_t>()[offset];
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// A double rounded to f32 "to odd", so that rounding it once more to a narrower float gives the
// correctly rounded double (no double-rounding error at ties).
float round_to_odd_f32(double x) {
  if (!std::isfinite(x)) return static_cast<float>(x);
  float f = static_cast<float>(x);
  if (static_cast<double>(f) == x || std::isinf(f)) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= 1u;
  std::memcpy(&f, &bits, 4);
  return f;
}

void store(const TensorView& t, int64_t offset, double value) {
  switch (t.dtype) {
    case DType::kF32:
      t.as<float>()[offset] = static_cast<float>(value);
      return;
    case DType::kF16:
      t.as<uint16_t>()[offset] = num::f32_to_f16(round_to_odd_f32(value));
      return;
    case DType::kBF16:
      t.as<uint16_t>()[offset] = num::f32_to_bf16(round_to_odd_f32(value));
      return;
    case DType::kE4M3:
      t.as<uint8_t>()[offset] = num::f32_to_e4m3(round_to_odd_f32(value));
      return;
    case DType::kE5M2:
      t.as<uint8_t>()[offset] = num::f32_to_e5m2(round_to_odd_f32(value));
      return;
    case DType::kI32:
      t.as<int32_t>()[offset] = static_cast<int32_t>(value);
      return;
    case DType::kU8:
      t.as<uint8_t>()[offset] = static_cast<uint8_t>(value);
      return;
  }
}

int64_t at(const TensorView& t, int64_t i0) { return i0 * t.strides[0]; }
int64_t at(const TensorView& t, int64_t i0, int64_t i1) {
  return i0 * t.strides[0] + i1 * t.strides[1];
}
int64_t at(const TensorView& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2];
}
int64_t at(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

int32_t load_i32(const TensorView& t, int64_t i) { return t.as<const int32_t>()[at(t, i)]; }

// Merges `count` states of one row (see the reference's merge_row): -inf states are skipped,
// a NaN LSE poisons the row, no state left gives o = 0 and lse = -inf.
template <class Lse, class Value, class Write>
double merge_row(int64_t count, int64_t dim, Lse lse, Value value, Write write,
                 std::vector<double>& weight) {
  double max_lse = kNegInf;
  for (int64_t k = 0; k < count; ++k) {
    const double s = lse(k);
    if (std::isnan(s)) {
      for (int64_t d = 0; d < dim; ++d) write(d, s);
      return s;
    }
    if (s > max_lse) max_lse = s;
  }
  if (max_lse == kNegInf) {
    for (int64_t d = 0; d < dim; ++d) write(d, 0.0);
    return kNegInf;
  }
  weight.assign(count, 0.0);
  double sum = 0.0;
  for (int64_t k = 0; k < count; ++k) {
    const double s = lse(k);
    if (s == kNegInf) continue;
    weight[k] = std::exp(s - max_lse);
    sum += weight[k];
  }
  for (int64_t d = 0; d < dim; ++d) {
    double o = 0.0;
    for (int64_t k = 0; k < count; ++k) {
      if (weight[k] != 0.0) o += weight[k] * value(k, d);
    }
    write(d, o / sum);
  }
  return max_lse + std::log(sum);
}

// Runs fn(row) for rows [0, rows) in items of kRowsPerItem rows.
template <class Fn>
void for_rows(int num_threads, int64_t rows, Fn&& fn) {
  const int64_t items = (rows + kRowsPerItem - 1) / kRowsPerItem;
  ThreadPool::global().parallel_for(num_threads, items, [&](int64_t item, int) {
    const int64_t end = std::min(rows, (item + 1) * kRowsPerItem);
    for (int64_t row = item * kRowsPerItem; row < end; ++row) fn(row);
  });
}

}  // namespace

Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                   const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                   int num_threads) {
  const int64_t rows = v_a.shape[0], heads = v_a.shape[1], dim = v_a.shape[2];
  for_rows(num_threads, rows * heads, [&](int64_t row) {
    const int64_t n = row / heads, h = row % heads;
    thread_local std::vector<double> weight;
    const double lse = merge_row(
        2, dim, [&](int64_t k) { return load(k == 0 ? s_a : s_b, at(k == 0 ? s_a : s_b, n, h)); },
        [&](int64_t k, int64_t d) {
          const TensorView& v = k == 0 ? v_a : v_b;
          return load(v, at(v, n, h, d));
        },
        [&](int64_t d, double o) { store(v_out, at(v_out, n, h, d), o); }, weight);
    if (!s_out.empty()) store(s_out, at(s_out, n, h), lse);
  });
  return Status::Ok();
}

Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                    const TensorView& s_out, int num_threads) {
  const int64_t rows = v.shape[0], states = v.shape[1], heads = v.shape[2], dim = v.shape[3];
  for_rows(num_threads, rows * heads, [&](int64_t row) {
    const int64_t n = row / heads, h = row % heads;
    thread_local std::vector<double> weight;
    const double lse = merge_row(
        states, dim, [&](int64_t k) { return load(s, at(s, n, k, h)); },
        [&](int64_t k, int64_t d) { return load(v, at(v, n, k, h, d)); },
        [&](int64_t d, double o) { store(v_out, at(v_out, n, h, d), o); }, weight);
    if (!s_out.empty()) store(s_out, at(s_out, n, h), lse);
  });
  return Status::Ok();
}

Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& cache, int num_threads) {
  const int64_t nnz = append_k.shape[0];
  const int64_t batch = cache.kv_indptr.shape[0] - 1;
  const int64_t num_pages = cache.k_cache.shape[0];
  const bool nhd = cache.layout == KVLayout::kNHD;
  const int64_t page_size = nhd ? cache.k_cache.shape[1] : cache.k_cache.shape[2];
  // Where each entry goes, checked up front so that a bad entry writes nothing at all.
  std::vector<int64_t> page_of(nnz), slot_of(nnz);
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t b = load_i32(batch_indices, i);
    if (b == kPaddedAppendRow) {  // a padded row writes nothing
      page_of[i] = -1;
      continue;
    }
    const int64_t pos = load_i32(positions, i);
    if (b < 0 || b >= batch || pos < 0) {
      return make_error(ErrorCode::kInvalidArgument, "append_paged_kv_cache: entry ", i,
                        " has batch index ", b, " and position ", pos, " outside the batch");
    }
    const int64_t page_begin = load_i32(cache.kv_indptr, b);
    const int64_t page_end = load_i32(cache.kv_indptr, b + 1);
    if (page_begin + pos / page_size >= page_end) {
      return make_error(ErrorCode::kInvalidArgument, "append_paged_kv_cache: position ", pos,
                        " of request ", b, " is past its ", page_end - page_begin, " pages");
    }
    // (paged::locate_token's arithmetic; the page table may be a strided view here.)
    const paged::PageSlot where{load_i32(cache.kv_indices, page_begin + pos / page_size),
                                pos % page_size};
    if (where.page < 0 || where.page >= num_pages) {
      return make_error(ErrorCode::kInvalidPageTable, "append_paged_kv_cache: page id ",
                        where.page, " is outside [0, ", num_pages, ")");
    }
    page_of[i] = where.page;
    slot_of[i] = where.slot;
  }
  const bool per_token = cache.scale_granularity == KVScaleGranularity::kPerTokenHead;
  const bool e5m2 = cache.k_cache.dtype == DType::kE5M2;
  auto write = [&](const TensorView& src, const TensorView& dst, const TensorView& scales,
                   double per_tensor, int64_t i) {
    const int64_t heads = src.shape[1], dim = src.shape[2];
    const paged::CacheStrides strides = paged::cache_strides(dst.strides.data(), !nhd);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = strides.offset(page_of[i], slot_of[i], h, 0);
      double scale = per_tensor;
      if (per_token) {
        // The row's scale (DESIGN.md §2), stored beside it at the same (page, slot, head).
        double amax = 0.0;
        for (int64_t d = 0; d < dim; ++d) {
          amax = std::max(amax, std::abs(static_cast<double>(load(src, at(src, i, h, d)))));
        }
        const float stored = num::per_token_fp8_scale(amax, e5m2);
        scales.as<float>()[at(scales, page_of[i], slot_of[i], h)] = stored;
        scale = stored;
      }
      for (int64_t d = 0; d < dim; ++d) {
        store(dst, base + d * strides.dim, load(src, at(src, i, h, d)) / scale);
      }
    }
  };
  for_rows(num_threads, nnz, [&](int64_t i) {
    if (page_of[i] < 0) return;  // padded
    write(append_k, cache.k_cache, cache.k_scale_cache, cache.k_scale, i);
    write(append_v, cache.v_cache, cache.v_scale_cache, cache.v_scale, i);
  });
  return Status::Ok();
}

Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                  const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                  int num_threads) {
  const TensorView& any = q.empty() ? k : q;
  const int64_t rows = any.shape[0];
  const int dim = static_cast<int>(any.shape[2]);
  const int rotary_dim = rope_rotary_dim(rope, dim);
  for_rows(num_threads, rows, [&](int64_t n) {
    thread_local std::vector<double> cos_t, sin_t, x;
    cos_t.resize(rotary_dim / 2);
    sin_t.resize(rotary_dim / 2);
    x.resize(dim);
    // The angles come from the same fp64 code as the reference's, so the results agree bit for
    // bit.
    rope_cos_sin(load_i32(pos_ids, n), rotary_dim, rope, cos_t.data(), sin_t.data());
    auto rotate = [&](const TensorView& in, const TensorView& out) {
      if (in.empty() || out.empty()) return;
      for (int64_t h = 0; h < in.shape[1]; ++h) {
        // The whole head vector is read before it is written: out may be in itself.
        for (int d = 0; d < dim; ++d) x[d] = load(in, at(in, n, h, d));
        rope_rotate_pairs(x.data(), rotary_dim, rope.interleave, cos_t.data(), sin_t.data());
        for (int d = 0; d < dim; ++d) store(out, at(out, n, h, d), x[d]);
      }
    };
    rotate(q, q_out);
    rotate(k, k_out);
  });
  return Status::Ok();
}

}  // namespace kvattn::cpu
