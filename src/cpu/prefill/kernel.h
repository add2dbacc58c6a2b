// The prefill kernel body, written once over a vector type `Vec` and compiled by each ISA's file
// with only that ISA's flags (prefill_avx512.cc, prefill_avx2.cc, prefill_scalar.cc). Each file
// includes this inside its own namespace, so no function here is shared between ISA levels (the
// linker could otherwise keep the AVX-512 copy of an inline function for the scalar path).
//
// Layout: a tile's query rows (all heads of a GQA group, token-major) run across vector lanes.
// S^T = K Q^T is then an outer product over d (one broadcast key element x a vector of rows), the
// softmax is lane-wise (no horizontal reductions), and O^T += V^T P^T is again an outer product,
// over keys. Scores are kept in the log2 domain (log2(e) folded into the staged Q) so exp2 is the
// only transcendental.
//
// The register products and their strip loops are f32_products.h's (included below, in the
// same way); this file holds the rest: KV addressing and prefetch, the tile's staging, masks,
// softmax and store.
//
// Requires before inclusion: namespace kvattn::cpu::prefill::<isa> open, `Vec` defined, and
// <cstdint>, <cstring>, <cmath>, core/math_constants.h and cpu/prefill/params.h included.

#include "cpu/prefill/masked_values.h"

inline constexpr float kNegInf = -__builtin_huge_valf();
using ::kvattn::math::kLog2e;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

inline int dtype_bytes(DType d) {
  switch (d) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    default:
      return 1;
  }
}

// Key j's element offset in a KV source (row or per-token scale), params.h.
inline int64_t kv_offset(const PrefillParams& p, const KVSource& s, const RequestInfo& req,
                         int64_t j, int kv_head) {
  if (!p.paged) return s.strides.offset(0, req.kv_token_begin + j, kv_head, 0);
  const int64_t page = p.page_ids[(req.page_begin + j / p.page_size) * p.page_ids_stride];
  return s.strides.offset(page, j % p.page_size, kv_head, 0);
}

// Consecutive keys of one request from key j on: where each one's rows lie, with the page table
// read once a page (when a row of it is asked for: never past the request's last page) and no
// division a key. (kv_offset, which the per-token scales still use, divides by the page size; the
// staging and the prefetch of a tile took two or three such a key: walked by this cursor, a
// cache-resident prefill of 16 query rows a tile ran 0.87x on Zen 4.)
class KeyCursor {
 public:
  KeyCursor() = default;
  KeyCursor(const PrefillParams& p, const RequestInfo& req, int64_t j) : p_(&p), req_(&req) {
    if (p.paged) {
      page_index_ = j / p.page_size;
      slot_ = j % p.page_size;
    } else {
      slot_ = req.kv_token_begin + j;
    }
  }
  // The current key's row in `s`, KV head `kv_head`.
  const unsigned char* row(const KVSource& s, int kv_head) {
    if (p_->paged && page_ < 0) {
      page_ = p_->page_ids[(req_->page_begin + page_index_) * p_->page_ids_stride];
    }
    return static_cast<const unsigned char*>(s.base) +
           s.strides.offset(p_->paged ? page_ : 0, slot_, kv_head, 0) * dtype_bytes(p_->kv_dtype);
  }
  void next() {
    ++slot_;
    if (p_->paged && slot_ == p_->page_size) {
      slot_ = 0;
      ++page_index_;
      page_ = -1;
    }
  }

 private:
  const PrefillParams* p_ = nullptr;
  const RequestInfo* req_ = nullptr;
  int64_t page_index_ = 0, slot_ = 0, page_ = -1;
};

// Prefetches the next KV tile's K and V rows a few lines per register block of this tile's
// products, so that their reads (L3 or DRAM, behind a page table the hardware prefetchers do not
// follow) overlap the arithmetic instead of stalling the next tile's staging. The whole tile's
// lines asked for in one burst (as until 2026-12-04) hold the L1 miss buffers the tile's own
// loads need, and on AMD the burst's prefetcht1 lines often never came: the AVX2 kernel on Zen 4
// then spent ~7 % of its time in the staging's loads. Where the lines go is the CPU class's
// (PrefillParams::prefetch_l1, as the decode kernel's hint): L1 on AMD, L2 on Intel. (The burst
// was a free function whose body was only prefetches, which GCC once found pure and dropped
// everywhere; this class keeps state, so its prefetches stay: check with objdump after changes.)
class NextTilePrefetch {
 public:
  // Keys [j0, j0 + keys) of the next tile, KV heads [kv_head, kv_head + heads) (heads > 1: their
  // rows side by side in each token's row, read as one run, into L2 on every class: 8 heads'
  // tile is 4-8 times L1, and into L1 a task of 16 rows ran 1.04-1.05x the time on Zen 4, where
  // asking for each next head's rows into L1 on top ran 1.02-1.06x); the pace is set by spread().
  void plan(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0, int keys,
            int heads = 1) {
    p_ = &p;
    req_ = &req;
    l1_ = p.prefetch_l1 && heads == 1;
    kv_head_ = kv_head;
    j_ = j0;
    end_ = j0 + keys;
    const int esize = dtype_bytes(p.kv_dtype);
    k_lines_ = (heads * p.head_dim_qk * esize * static_cast<int>(p.k.strides.dim) + 63) / 64;
    v_lines_ = (heads * p.head_dim_vo * esize * static_cast<int>(p.v.strides.dim) + 63) / 64;
    line_ = 0;
    per_step_ = 0;
    cursor_ = KeyCursor(p, req, j0);
    if (j_ < end_) rows();
  }
  // Spreads the lines over about `steps` calls of step().
  void spread(int steps) {
    const int64_t lines = (end_ - j_) * (k_lines_ + v_lines_);
    per_step_ = steps > 0 ? static_cast<int>((lines + steps - 1) / steps) : 0;
  }
  void step() { issue(per_step_); }
  // Whatever is left (the tile's products are done).
  void finish() { issue(1 << 30); }

 private:
  void rows() {
    k_ = reinterpret_cast<const char*>(cursor_.row(p_->k, kv_head_));
    v_ = reinterpret_cast<const char*>(cursor_.row(p_->v, kv_head_));
  }
  void issue(int n) {
    for (; n > 0 && j_ < end_; --n) {
      const char* at = line_ < k_lines_ ? k_ + 64 * line_ : v_ + 64 * (line_ - k_lines_);
      if (l1_) {
        __builtin_prefetch(at, 0, 3);
      } else {
        __builtin_prefetch(at, 0, 2);
      }
      if (++line_ == k_lines_ + v_lines_) {
        line_ = 0;
        cursor_.next();
        if (++j_ < end_) rows();
      }
    }
  }
  const PrefillParams* p_ = nullptr;
  const RequestInfo* req_ = nullptr;
  KeyCursor cursor_;
  int kv_head_ = 0;
  bool l1_ = false;
  int64_t j_ = 0, end_ = 0;
  int k_lines_ = 0, v_lines_ = 0, line_ = 0, per_step_ = 0;
  const char* k_ = nullptr;
  const char* v_ = nullptr;
};

// Rotates x (head dim `dim`) at absolute position `pos` with the precomputed cos/sin table.
inline void rope_rotate(const PrefillParams& p, int64_t pos, int dim, float* x) {
  const int half = dim / 2;
  const float* cs = p.rope_table + (pos - p.rope_pos_begin) * 2 * half;
  for (int t = 0; t < half; ++t) {
    const float c = cs[2 * t], s = cs[2 * t + 1];
    float& x1 = p.rope_interleave ? x[2 * t] : x[t];
    float& x2 = p.rope_interleave ? x[2 * t + 1] : x[t + half];
    const float r1 = x1 * c - x2 * s;
    const float r2 = x2 * c + x1 * s;
    x1 = r1;
    x2 = r2;
  }
}

#include "cpu/prefill/f32_products.h"

// ---- One tile: `tokens` query tokens [t0, t0 + tokens) of request `req`, KV head `kv_head`.

struct TileRows {
  int64_t t0 = 0;
  int tokens = 0, rows = 0, row_vecs = 0;
  int64_t rows_pad = 0;
};

// Which keys the tile needs and which of its KV tiles need the mask.
struct KeyRange {
  int64_t begin = 0, end = 0;
  // Keys in [full_begin, full_end) are visible to every row of the tile (causal / window); a KV
  // tile inside it skips the mask. Empty with a custom mask.
  int64_t full_begin = 0, full_end = 0;
};

inline KeyRange key_range(const PrefillParams& p, const RequestInfo& req, const TileRows& t) {
  const int64_t offset = req.kv_len - req.qo_len;
  const int64_t first_abs = t.t0 + offset, last_abs = t.t0 + t.tokens - 1 + offset;
  KeyRange r;
  r.begin = 0;
  r.end = req.kv_len;
  r.full_begin = 0;
  r.full_end = req.kv_len;
  if (p.causal) {
    r.end = imin(r.end, last_abs + 1);
    r.full_end = imin(r.full_end, first_abs + 1);
  }
  if (p.window_left >= 0) {
    r.begin = imax(r.begin, first_abs - p.window_left);
    r.full_begin = imax(r.full_begin, last_abs - p.window_left);
  }
  if (p.custom_mask != nullptr) r.full_begin = r.full_end = 0;
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

// The per-row state of a tile: absolute position, ALiBi slope, running max and sum, O^T = 0.
inline void init_rows(const PrefillParams& p, const RequestInfo& req, int kv_head,
                      const TileRows& t, float* scratch) {
  const ScratchLayout& L = p.scratch;
  auto* row_pos = reinterpret_cast<int32_t*>(scratch + L.row_pos);
  float* row_slope = scratch + L.row_slope;
  float* row_max = scratch + L.row_max;
  float* row_sum = scratch + L.row_sum;
  const int64_t offset = req.kv_len - req.qo_len;
  for (int r = 0; r < t.rows_pad; ++r) {
    // Padding rows repeat the last real row's position so that masks treat them alike.
    const int token = (r < t.rows ? r : t.rows - 1) / p.group;
    const int head = kv_head * p.group + r % p.group;
    row_pos[r] = static_cast<int32_t>(t.t0 + token + offset);
    row_slope[r] = p.alibi_slopes_log2e ? p.alibi_slopes_log2e[head] : 0.0f;
    row_max[r] = kNegInf;
    row_sum[r] = 0.0f;
  }
  float* ot = scratch + L.ot;
  for (int64_t e = 0; e < int64_t{p.head_dim_vo} * t.rows_pad; ++e) ot[e] = 0.0f;
}

// The bytes of query row `token` (within the tile), head `head`.
inline const unsigned char* query_row(const PrefillParams& p, const RequestInfo& req,
                                      const TileRows& t, int token, int head) {
  const int64_t offset = (req.qo_begin + t.t0 + token) * p.q_stride_token + head * p.q_stride_head;
  return static_cast<const unsigned char*>(p.q) + offset * dtype_bytes(p.q_dtype);
}

// dst[d][c] = rows[c][d] for c < W (Vec::W rows of `pitch` floats at `rows`) and d < dim, dst's
// rows `dst_pitch` floats apart, each times `scale`: W x W blocks by Vec::transpose, the dims past
// a multiple of W one by one.
inline void transpose_rows(const float* rows, int pitch, int dim, float scale, float* dst,
                           int64_t dst_pitch) {
  using R = typename Vec::Reg;
  constexpr int W = Vec::W;
  const R s = Vec::set1(scale);
  int d0 = 0;
  for (; d0 + W <= dim; d0 += W) {
    R v[W];
    for (int c = 0; c < W; ++c) v[c] = Vec::load(rows + c * pitch + d0);
    Vec::transpose(v);
    for (int i = 0; i < W; ++i) Vec::store(dst + (d0 + i) * dst_pitch, Vec::mul(v[i], s));
  }
  for (; d0 < dim; ++d0) {
    for (int c = 0; c < W; ++c) dst[d0 * dst_pitch + c] = rows[c * pitch + d0] * scale;
  }
}

// Stages Q^T for the tile: q * q_scale (rotated), times qk_scale; padding rows are zeros. Vec::W
// rows at a time, converted to f32 at row_tmp and transposed in registers (transpose_rows): a
// float a store, as until 2026-12-07, the AVX2 kernel spent ~10 % of its time on 64 requests of
// 128 tokens here and in store_tile, where a tile's queries meet 32-128 keys.
inline void stage_queries(const PrefillParams& p, const RequestInfo& req, int kv_head,
                          const TileRows& t, float* scratch) {
  const ScratchLayout& L = p.scratch;
  float* qt = scratch + L.qt;
  float* rows = scratch + L.row_tmp;  // [W][dim]
  const auto* row_pos = reinterpret_cast<const int32_t*>(scratch + L.row_pos);
  const int dim = p.head_dim_qk;
  for (int r0 = 0; r0 < t.rows_pad; r0 += Vec::W) {  // rows_pad: a multiple of 16
    for (int c = 0; c < Vec::W; ++c) {
      const int r = r0 + c;
      float* row = rows + c * dim;
      if (r >= t.rows) {
        for (int d = 0; d < dim; ++d) row[d] = 0.0f;
        continue;
      }
      const int head = kv_head * p.group + r % p.group;
      load_row_as_f32<Vec>(query_row(p, req, t, r / p.group, head), p.q_dtype, dim, p.q_stride_dim,
                           p.q_scale, row);
      if (p.rope_table) rope_rotate(p, row_pos[r], dim, row);
    }
    transpose_rows(rows, dim, dim, p.qk_scale, qt + r0, t.rows_pad);
  }
}

// The per-(token, head) scale of key j (addressed like its row, element size 4).
inline float token_scale(const PrefillParams& p, const KVSource& s, const RequestInfo& req,
                         int64_t j, int kv_head) {
  return static_cast<const float*>(s.base)[kv_offset(p, s, req, j, kv_head)];
}

inline void stage_kv_tile(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0,
                          int keys, float* scratch) {
  const ScratchLayout& L = p.scratch;
  float* kf = scratch + L.kf;
  float* vf = scratch + L.vf;
  const float k_scale = p.k_head_scale ? p.k_head_scale[kv_head] : p.k_scale;
  const float v_scale = p.v_head_scale ? p.v_head_scale[kv_head] : p.v_scale;
  const bool per_token = p.k_token_scale.base != nullptr;
  KeyCursor key(p, req, j0);
  for (int jj = 0; jj < keys; ++jj, key.next()) {
    const int64_t j = j0 + jj;
    float* k = kf + int64_t{jj} * L.k_pitch;
    const float ks = per_token ? token_scale(p, p.k_token_scale, req, j, kv_head) : k_scale;
    const float vs = per_token ? token_scale(p, p.v_token_scale, req, j, kv_head) : v_scale;
    load_row_as_f32<Vec>(key.row(p.k, kv_head), p.kv_dtype, p.head_dim_qk, p.k.strides.dim, ks, k);
    if (p.rope_table) rope_rotate(p, j, p.head_dim_qk, k);
    load_row_as_f32<Vec>(key.row(p.v, kv_head), p.kv_dtype, p.head_dim_vo, p.v.strides.dim, vs,
                         vf + int64_t{jj} * L.v_pitch);
  }
}

inline bool custom_mask_bit(const PrefillParams& p, const RequestInfo& req, int64_t i, int64_t j) {
  const int64_t bit = i * req.kv_len + j;
  if (!p.custom_mask_packed)
    return p.custom_mask[(req.mask_begin + bit) * p.custom_mask_stride] != 0;
  const uint8_t byte = p.custom_mask[(req.mask_begin + (bit >> 3)) * p.custom_mask_stride];
  return ((byte >> (bit & 7)) & 1) != 0;
}

// Soft cap, fp16 rounding and ALiBi on a tile of scores: lane-wise, no mask.
inline void transform_scores(const PrefillParams& p, const TileRows& t, int64_t j0, int keys,
                             float* scratch) {
  using R = typename Vec::Reg;
  float* st = scratch + p.scratch.st;
  const float* row_slope = scratch + p.scratch.row_slope;
  const auto* row_pos = reinterpret_cast<const int32_t*>(scratch + p.scratch.row_pos);
  alignas(64) float pos_f[Vec::W];
  for (int rv = 0; rv < t.row_vecs; ++rv) {
    const R slope = Vec::load(row_slope + rv * Vec::W);
    for (int l = 0; l < Vec::W; ++l) pos_f[l] = static_cast<float>(row_pos[rv * Vec::W + l]);
    const R pos = Vec::load(pos_f);
    for (int jj = 0; jj < keys; ++jj) {
      float* s = st + jj * t.rows_pad + rv * Vec::W;
      R x = Vec::load(s);
      if (p.fp16_qk_reduction) x = Vec::mul(Vec::round_f16(x), Vec::set1(p.reduction_scale));
      if (p.soft_cap > 0.0f) x = Vec::mul(Vec::tanh(x), Vec::set1(p.cap_log2e));
      if (p.alibi_slopes_log2e) {
        x = Vec::fma(slope, Vec::sub(Vec::set1(static_cast<float>(j0 + jj)), pos), x);
      }
      Vec::store(s, x);
    }
  }
}

inline void fill_neg_inf(float* s, int n) {
  for (int i = 0; i < n; ++i) s[i] = kNegInf;
}

// Sets invisible scores to -inf (edge tiles and custom masks only). Causal and window masks: a
// row's position does not decrease with the row (token-major rows), so the rows key j is hidden
// from are a prefix (causal: position < j) and a suffix (window: position > j + window_left),
// both moving forward with j: two runs a key.
inline void mask_scores(const PrefillParams& p, const RequestInfo& req, const TileRows& t,
                        int64_t j0, int keys, float* scratch) {
  float* st = scratch + p.scratch.st;
  const auto* row_pos = reinterpret_cast<const int32_t*>(scratch + p.scratch.row_pos);
  const int64_t offset = req.kv_len - req.qo_len;
  if (p.custom_mask == nullptr) {
    int before = 0, after = p.window_left >= 0 ? 0 : t.rows;  // visible rows [before, after)
    for (int jj = 0; jj < keys; ++jj) {
      const int64_t j = j0 + jj;
      if (p.causal) {
        while (before < t.rows && row_pos[before] < j) ++before;
      }
      if (p.window_left >= 0) {
        while (after < t.rows && row_pos[after] <= j + p.window_left) ++after;
      }
      float* s = st + jj * t.rows_pad;
      fill_neg_inf(s, before);
      const int from = after > before ? after : before;
      fill_neg_inf(s + from, t.rows - from);
    }
    return;
  }
  for (int jj = 0; jj < keys; ++jj) {
    const int64_t j = j0 + jj;
    float* s = st + jj * t.rows_pad;
    for (int r = 0; r < t.rows; ++r) {
      const int64_t pos = row_pos[r];
      bool visible = true;
      if (p.causal && j > pos) visible = false;
      if (p.window_left >= 0 && j < pos - p.window_left) visible = false;
      if (visible && p.custom_mask && !custom_mask_bit(p, req, pos - offset, j)) visible = false;
      if (!visible) s[r] = kNegInf;
    }
  }
}

// The running max moves only where a tile's scores pass it by more than this (log2 units): below
// that, P = 2^(s - max) <= 256 is kept as it is (the f32 sums and O^T hold it as precisely) and
// the rescale of O^T, head_dim_vo multiplies a row, is skipped.
inline constexpr float kRescaleSlack = 8.0f;

// Online softmax over one KV tile: new running max, rescale of O^T and the sum where it grew
// (lazily: a row vector's max moves where one of its rows passes kRescaleSlack, ~2.5 % of the
// AVX2 kernel's time at d 128 before), P = exp2(S - max) in place of S: by
// Vec::exp2_probability (a shorter polynomial) where q is a 16-bit or FP8 type, whose rounding
// of P the tolerance allows (kLowPrecisionP).
template <bool kLowPrecisionP>
inline void softmax_update(const PrefillParams& p, const TileRows& t, int keys, float* scratch) {
  using R = typename Vec::Reg;
  float* st = scratch + p.scratch.st;
  float* ot = scratch + p.scratch.ot;
  float* row_max = scratch + p.scratch.row_max;
  float* row_sum = scratch + p.scratch.row_sum;
  for (int rv = 0; rv < t.row_vecs; ++rv) {
    const R old_max = Vec::load(row_max + rv * Vec::W);
    R new_max = old_max;
    for (int jj = 0; jj < keys; ++jj)
      new_max = Vec::max(new_max, Vec::load(st + jj * t.rows_pad + rv * Vec::W));
    // A row that has seen no key yet keeps max -inf (old_max + slack too: its first key moves
    // it); a NaN score never moves it (the sum carries the NaN).
    const bool moves = Vec::any_greater(new_max, Vec::add(old_max, Vec::set1(kRescaleSlack)));
    if (!moves) new_max = old_max;
    // Subtracting 0 from a max of -inf keeps exp2 at 0.
    const R base = Vec::zero_if_neg_inf(new_max);
    R sum = Vec::load(row_sum + rv * Vec::W);
    if (moves) {
      const R alpha = Vec::exp2(Vec::sub(old_max, base));
      sum = Vec::mul(sum, alpha);
      for (int d = 0; d < p.head_dim_vo; ++d) {
        float* o = ot + d * t.rows_pad + rv * Vec::W;
        Vec::store(o, Vec::mul(Vec::load(o), alpha));
      }
    }
    for (int jj = 0; jj < keys; ++jj) {
      float* s = st + jj * t.rows_pad + rv * Vec::W;
      const R x = Vec::sub(Vec::load(s), base);
      const R e = kLowPrecisionP ? Vec::exp2_probability(x) : Vec::exp2(x);
      Vec::store(s, e);
      sum = Vec::add(sum, e);
    }
    Vec::store(row_sum + rv * Vec::W, sum);
    Vec::store(row_max + rv * Vec::W, new_max);
  }
}

// Row r of the tile through the one epilogue (common/epilogue.h): o = O / sum in o's dtype, the
// natural-log LSE, the sink joining the denominator; a row that saw no key writes o = 0 and
// lse = -inf (or the sink), a row with a NaN score o = lse = NaN — the sum carries the NaN (exp2
// keeps it) even where the running max skipped it, and a NaN max marks the row too. `o`: the
// row's unnormalized output (head_dim_vo floats), scaled in place.
inline void store_row(const PrefillParams& p, const RequestInfo& req, int kv_head,
                      const TileRows& t, int r, float value_scale, const float* scratch, float* o) {
  const float* row_max = scratch + p.scratch.row_max;
  const float* row_sum = scratch + p.scratch.row_sum;
  const int head = kv_head * p.group + r % p.group;
  const math::RowFinish fin =
      finish_row(row_max[r], row_sum[r], value_scale, row_max[r] != row_max[r],
                 p.sinks ? p.sinks + head : nullptr);
  for (int d = 0; d < p.head_dim_vo; ++d) o[d] *= fin.o_scale;
  const int64_t token = req.qo_begin + t.t0 + r / p.group;
  p.output.store_with<Vec>(token, head, o, p.head_dim_vo, fin.lse);
}

// The tile's rows (store_row), Vec::W at a time transposed from O^T into row_tmp.
inline void store_tile(const PrefillParams& p, const RequestInfo& req, int kv_head,
                       const TileRows& t, float value_scale, float* scratch) {
  const float* ot = scratch + p.scratch.ot;
  float* rows = scratch + p.scratch.row_tmp;  // [W][dvo]
  const int dvo = p.head_dim_vo;
  for (int r0 = 0; r0 < t.rows; r0 += Vec::W) {  // rows_pad: a multiple of 16
    // O^T's dims as the rows of a W-column block, back into rows of dvo floats.
    for (int d0 = 0; d0 < dvo; d0 += Vec::W) {
      const int count = dvo - d0 < Vec::W ? dvo - d0 : Vec::W;
      if (count == Vec::W) {
        transpose_rows(ot + int64_t{d0} * t.rows_pad + r0, static_cast<int>(t.rows_pad), Vec::W,
                       1.0f, rows + d0, dvo);
      } else {
        for (int c = 0; c < Vec::W; ++c) {
          for (int d = d0; d < dvo; ++d) rows[c * dvo + d] = ot[d * t.rows_pad + r0 + c];
        }
      }
    }
    const int n = t.rows - r0 < Vec::W ? t.rows - r0 : Vec::W;
    for (int c = 0; c < n; ++c) {
      store_row(p, req, kv_head, t, r0 + c, value_scale, scratch, rows + c * dvo);
    }
  }
}

// One tile of query rows over its keys, for the KV heads [kv_head, kv_head + heads) of a task
// (hp[h]: head h's parameters, with its scratch slot: ScratchLayout::for_head). Each KV tile is
// taken by every head of the task in turn, and the next tile's rows of all of them are asked for
// during their products (one run of each token's rows where heads > 1): a tile of few query rows
// (a few tokens of a speculative-decoding check) is over too soon to hide one head's 256-byte
// slices of each token row, read on their own, behind its arithmetic.
inline void run_tile(const PrefillParams* hp, int heads, const RequestInfo& req, int kv_head,
                     const TileRows& t, float* scratch) {
  for (int h = 0; h < heads; ++h) {
    init_rows(hp[h], req, kv_head + h, t, scratch);
    stage_queries(hp[h], req, kv_head + h, t, scratch);
  }
  const PrefillParams& p0 = hp[0];
  const KeyRange keys = key_range(p0, req, t);
  const bool transform = p0.soft_cap > 0.0f || p0.fp16_qk_reduction || p0.alibi_slopes_log2e;
  const int kv_tile = p0.tile.kv_tile;
  const bool low_precision_p = p0.q_dtype != DType::kF32;
  NextTilePrefetch pf;
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kv_tile) {
    const int n = static_cast<int>(imin(kv_tile, keys.end - j0));
    pf.plan(p0, req, kv_head, j0 + kv_tile,
            static_cast<int>(imax(0, imin(kv_tile, keys.end - j0 - kv_tile))), heads);
    pf.spread(heads * register_blocks(t.row_vecs, n, p0.head_dim_vo));
    const bool full = j0 >= keys.full_begin && j0 + n <= keys.full_end;
    for (int h = 0; h < heads; ++h) {
      const PrefillParams& p = hp[h];
      stage_kv_tile(p, req, kv_head + h, j0, n, scratch);
      const VisibleKeys visible = tile_visible_keys(p, full, j0, scratch);
      scores(scratch + p.scratch.kf, p.head_dim_qk, p.scratch.k_pitch, scratch + p.scratch.qt,
             t.rows_pad, t.row_vecs, n, scratch + p.scratch.st, pf, visible);
      if (transform) transform_scores(p, t, j0, n, scratch);
      if (!full) mask_scores(p, req, t, j0, n, scratch);
      if (low_precision_p) {
        softmax_update<true>(p, t, n, scratch);
      } else {
        softmax_update<false>(p, t, n, scratch);
      }
      // The numerics policy (masked_values.h): only a tile that masks a key checks its V.
      float* vf = scratch + p.scratch.vf;
      if (!full && any_non_finite_rows(vf, n, p.head_dim_vo, p.scratch.v_pitch)) {
        add_non_finite_values(n, t.rows, t.rows_pad, p.head_dim_vo, p.scratch.v_pitch,
                              scratch + p.scratch.st, vf, scratch + p.scratch.ot);
      }
      accumulate_values(scratch + p.scratch.vf, p.head_dim_vo, p.scratch.v_pitch,
                        scratch + p.scratch.st, t.rows_pad, t.row_vecs, n, scratch + p.scratch.ot,
                        pf, visible);
    }
    pf.finish();
  }
  for (int h = 0; h < heads; ++h) store_tile(hp[h], req, kv_head + h, t, 1.0f, scratch);
}

// The tile of query tokens [t0, min(t0 + tile tokens, qo_end)).
inline TileRows tile_rows(const PrefillParams& p, int64_t t0, int64_t qo_end) {
  TileRows t;
  t.t0 = t0;
  t.tokens = static_cast<int>(imin(p.tile.tokens, qo_end - t0));
  t.rows = t.tokens * p.group;
  t.rows_pad = row_pitch(t.rows);
  t.row_vecs = static_cast<int>((t.rows + Vec::W - 1) / Vec::W);
  return t;
}

// A task (PrefillItemFn, params.h): its query tiles, each over the keys of all its heads.
template <void (*kRunTile)(const PrefillParams*, int, const RequestInfo&, int, const TileRows&,
                           float*)>
inline void run_task(const PrefillParams& p, const WorkItem* items, int heads, float* scratch) {
  PrefillParams hp[kPrefillMaxTaskHeads];
  for (int h = 0; h < heads; ++h) {
    hp[h] = p;
    hp[h].scratch = p.scratch.for_head(h);
  }
  const WorkItem& item = items[0];
  const RequestInfo& req = p.requests[item.request];
  for (int64_t t0 = item.qo_begin; t0 < item.qo_end; t0 += p.tile.tokens) {
    kRunTile(hp, heads, req, item.kv_head, tile_rows(p, t0, item.qo_end), scratch);
  }
}

inline void run_item(const PrefillParams& p, const WorkItem* items, int heads, float* scratch) {
  run_task<&run_tile>(p, items, heads, scratch);
}
