// What the two bf16-product prefill kernels share (prefill_avx512_bf16.cc on vdpbf16ps,
// prefill_amx.cc on AMX tiles): the bf16 pair layout of Q^T, V and P, the online softmax that
// packs P into it, and the tile loop. A kernel supplies only its two products (a `Products` type:
// stage the tile's K in its own form, S^T = K Q^T, O^T += V^T P^T).
//
// Layout: the pairs of a dot product sit in one dword. Q^T holds (q[r][2p], q[r][2p+1]) at
// [p][r], which a bf16 row already stores side by side. P and V pair keys instead: P^T
// (P[r][2p], P[r][2p+1]) at [p][r] (written over S^T), V (V[2p][d], V[2p+1][d]) at [p][d] in the
// V tile buffer. P is rounded to bf16 before P V, as a 16-bit MMA consumes it on a GPU (and as
// the tolerance's baseline does); the row sums use the unrounded P. Everything else (masks, soft
// cap, ALiBi, epilogue) is the f32 kernel's code from kernel.h (with the numerics policy's guard,
// masked_values.h).
//
// Included inside the namespace of each kernel file after avx512_vec.h and kernel.h (AVX-512 and
// AVX512_BF16 flags); needs <immintrin.h>, <cstdint>, <cstring> and cpu/common/bf16_split.h.

inline uint32_t load_u32(const unsigned char* p) {
  uint32_t x;
  std::memcpy(&x, p, 4);
  return x;
}

// Q^T pairs for the tile (bf16 queries: a pair is one dword of the row), 16 rows x 16 pairs at a
// time by one 16 x 16 dword transpose in registers (transpose16), the tile's query lines all asked
// for first; padding rows are 0. (A dword a load, as until 2026-12-07, was ~2 % of the AMX
// kernel's time, and of the bf16-dot kernel's ~10 % on 64 requests of 128 tokens, where a tile's
// queries meet 32-128 keys.)
inline void stage_query_pairs(const PrefillParams& p, const RequestInfo& req, int kv_head,
                              const TileRows& t, float* scratch) {
  auto* qp = reinterpret_cast<uint32_t*>(scratch + p.scratch.qt);
  const int pairs = p.head_dim_qk / 2;
  for (int r = 0; r < t.rows; ++r) {
    const unsigned char* q = query_row(p, req, t, r / p.group, kv_head * p.group + r % p.group);
    for (int b = 0; b < 4 * pairs; b += 64) __builtin_prefetch(q + b, 0, 3);
  }
  for (int r0 = 0; r0 < t.rows_pad; r0 += 16) {  // rows_pad: a multiple of 16
    const unsigned char* rows[16];
    for (int i = 0; i < 16; ++i) {
      const int r = r0 + i;
      rows[i] =
          r < t.rows ? query_row(p, req, t, r / p.group, kv_head * p.group + r % p.group) : nullptr;
    }
    for (int pr0 = 0; pr0 < pairs; pr0 += 16) {
      const int count = pairs - pr0 < 16 ? pairs - pr0 : 16;
      const auto m = static_cast<__mmask16>((1u << count) - 1);
      __m512i v[16];
      for (int i = 0; i < 16; ++i) {
        v[i] = rows[i] ? _mm512_maskz_loadu_epi32(m, rows[i] + 4 * pr0) : _mm512_setzero_si512();
      }
      ::kvattn::cpu::avx512::transpose16(v);
      for (int i = 0; i < count; ++i) _mm512_storeu_si512(qp + (pr0 + i) * t.rows_pad + r0, v[i]);
    }
  }
}

// Top halves of f32 values that are exactly bf16 (widened fp8): the bf16 bits.
inline void f32_to_bf16_exact(const float* src, int n, uint16_t* dst) {
  int i = 0;
  for (; i + Vec::W <= n; i += Vec::W) {
    const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(Vec::load(src + i)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(bits));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512i bits =
        _mm512_srli_epi32(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, src + i)), 16);
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(bits));
  }
}

// A K or V row as bf16 bits: the cache row itself for bf16, else widened (exactly) into `buffer`.
inline const uint16_t* bf16_row(const PrefillParams& p, const void* row, int dim, float* tmp,
                                uint16_t* buffer) {
  if (p.kv_dtype == DType::kBF16) return static_cast<const uint16_t*>(row);
  load_row_as_f32<Vec>(row, p.kv_dtype, dim, 1, 1.0f, tmp);
  f32_to_bf16_exact(tmp, dim, buffer);
  return buffer;
}

// The V pairs of keys [j0, j0 + keys) at the V tile buffer: rows 2p and 2p + 1 interleaved; an
// odd tail pairs with zeros.
inline void stage_value_pairs(const PrefillParams& p, const RequestInfo& req, int kv_head,
                              int64_t j0, int keys, float* scratch) {
  auto* vp = reinterpret_cast<uint32_t*>(scratch + p.scratch.vf);
  float* tmp = scratch + p.scratch.row_tmp;
  const int dvo = p.head_dim_vo;
  auto* row_a = reinterpret_cast<uint16_t*>(scratch + p.scratch.pair_rows);
  uint16_t* row_b = row_a + dvo;
  uint16_t* zeros = row_b + dvo;
  if (keys % 2 != 0) std::memset(zeros, 0, sizeof(uint16_t) * dvo);
  // Word 2i of a pair vector from row a's column i, word 2i + 1 from row b's (b's words are 32 on
  // in the two-source permute): columns 0-15 (lo) and 16-31 (hi) of a 32-column chunk.
  alignas(64) static constexpr int16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                  37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                  11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr int16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                  53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                  27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i interleave_lo = _mm512_load_si512(kLo), interleave_hi = _mm512_load_si512(kHi);
  KeyCursor key(p, req, j0);
  for (int jj = 0; jj < keys; jj += 2) {
    const uint16_t* a = bf16_row(p, key.row(p.v, kv_head), dvo, tmp, row_a);
    key.next();
    const uint16_t* b = jj + 1 < keys ? bf16_row(p, key.row(p.v, kv_head), dvo, tmp, row_b) : zeros;
    key.next();
    uint32_t* out = vp + (jj / 2) * dvo;
    // 32 columns of both rows at a time, interleaved by two-source word permutes (one per 16
    // pairs: a zero-extension, shift and OR per row, as until 2026-12-07, was ~25 % of a tile of
    // 16 query rows on Zen 4).
    for (int d = 0; d < dvo; d += 32) {
      const int count = dvo - d < 32 ? dvo - d : 32;
      const auto m = static_cast<__mmask32>(count == 32 ? ~0u : (1u << count) - 1);
      const __m512i ra = _mm512_maskz_loadu_epi16(m, a + d);
      const __m512i rb = _mm512_maskz_loadu_epi16(m, b + d);
      const auto m_lo = static_cast<__mmask16>(count >= 16 ? 0xFFFF : (1u << count) - 1);
      _mm512_mask_storeu_epi32(out + d, m_lo, _mm512_permutex2var_epi16(ra, interleave_lo, rb));
      if (count > 16) {
        const auto m_hi = static_cast<__mmask16>(count == 32 ? 0xFFFF : (1u << (count - 16)) - 1);
        _mm512_mask_storeu_epi32(out + d + 16, m_hi,
                                 _mm512_permutex2var_epi16(ra, interleave_hi, rb));
      }
    }
  }
}

// The online softmax of kernel.h's softmax_update (its lazy rescale per lane here) fused with the
// score scale (c > 0, so the max of c * s is c times the max of s) and with the packing of P into
// bf16 pairs over keys, written in place: pair row p is stored after rows 2p and 2p + 1 of S were
// read, and no later step reads them. The row sums add the unrounded P.
//
// kSplit (per-(token, head) V scales, `value_scale` each key's): the weights W = P x scale, each
// as two bf16 (split_bf16, cpu/common/bf16_split.h), hi over S^T as P's pairs, lo at scratch +
// p_lo in the same layout; P V then runs over both (the low parts over V with its infinities
// zeroed). hi + lo is W to 2^-16 of it at worst: one bf16 would round each token's scale, up to
// 2^-9 of the dominant key's value where the tolerance's baseline (P rounded, V dequantized in
// f32) does not err; rounded P times V scaled and split would err as much as the baseline,
// uncorrelated with it (twice its error or more where few keys dominate: ALiBi).
template <bool kSplit = false>
inline void softmax_pack(const PrefillParams& p, const TileRows& t, int keys, float scale,
                         float* scratch, const float* value_scale = nullptr) {
  using R = Vec::Reg;
  float* st = scratch + p.scratch.st;
  float* ot = scratch + p.scratch.ot;
  float* row_max = scratch + p.scratch.row_max;
  float* row_sum = scratch + p.scratch.row_sum;
  const R c = Vec::set1(scale);
  // vcvtne2ps2bf16 rounds two vectors to bf16 (nearest even) side by side, [a | b]; vpermw
  // interleaves them into pair words (a[i], b[i]).
  alignas(64) static constexpr int16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const R slack = Vec::set1(p.alibi_slopes_log2e ? 0.0f : kRescaleSlack);
  for (int rv = 0; rv < t.row_vecs; ++rv) {
    float* s = st + rv * Vec::W;
    const R old_max = Vec::load(row_max + rv * Vec::W);
    // Four running maxima: one chain of dependent vmaxps (4 cycles each) over 128 keys cost more
    // than the loads it waits on.
    R part[4] = {Vec::set1(kNegInf), Vec::set1(kNegInf), Vec::set1(kNegInf), Vec::set1(kNegInf)};
    int k = 0;
    for (; k + 4 <= keys; k += 4) {
      for (int u = 0; u < 4; ++u) part[u] = Vec::max(part[u], Vec::load(s + (k + u) * t.rows_pad));
    }
    for (; k < keys; ++k) part[0] = Vec::max(part[0], Vec::load(s + k * t.rows_pad));
    const R raw_max = Vec::max(Vec::max(part[0], part[1]), Vec::max(part[2], part[3]));
    // The running max moves only where the tile's passes it by more than kRescaleSlack: below
    // that, P = 2^(s - max) <= 2^kRescaleSlack stays as it is (the f32 sums and O^T and the bf16
    // P hold it as precisely), and the rescale of O^T (head_dim_vo multiplies a row) is skipped.
    // A NaN score never moves it (the sum carries the NaN); a row's first keys always do. With
    // ALiBi it moves on any rise (slack 0): the row's max then sits in its last tiles (causal),
    // and P kept 2^delta (delta < slack, not whole) above the final max rounds to bf16 unlike a
    // plain kernel's P: on Zen 5 (`kvattn run --op batch_prefill_paged ... --pos-encoding-mode
    // ALIBI --check`, 2-3 KV tiles) 1.08-1.74x the baseline's error against the 2x bound, 0.95-
    // 1.01x with slack 0, which costs ALiBi prefill ~1 % and would cost the plain causal one 4-5 %.
    const R tile_max = Vec::mul(raw_max, c);
    const __mmask16 moves = _mm512_cmp_ps_mask(tile_max, Vec::add(old_max, slack), _CMP_GT_OQ);
    const R new_max = _mm512_mask_blend_ps(moves, old_max, tile_max);
    const R base = Vec::zero_if_neg_inf(new_max);
    const R neg_base = Vec::sub(Vec::zero(), base);
    R sum = Vec::load(row_sum + rv * Vec::W);
    if (moves != 0) {
      const R alpha = Vec::exp2(Vec::sub(old_max, base));
      sum = Vec::mul(sum, alpha);
      for (int d = 0; d < p.head_dim_vo; ++d) {
        float* o = ot + d * t.rows_pad + rv * Vec::W;
        Vec::store(o, Vec::mul(Vec::load(o), alpha));
      }
    }
    for (int jj = 0; jj < keys; jj += 2) {
      const R a = Vec::exp2_probability(Vec::fma(Vec::load(s + jj * t.rows_pad), c, neg_base));
      const R b = jj + 1 < keys ? Vec::exp2_probability(
                                      Vec::fma(Vec::load(s + (jj + 1) * t.rows_pad), c, neg_base))
                                : Vec::zero();
      sum = Vec::add(sum, Vec::add(a, b));
      if constexpr (kSplit) {
        const R wa = Vec::mul(a, Vec::set1(value_scale[jj]));
        const R wb = jj + 1 < keys ? Vec::mul(b, Vec::set1(value_scale[jj + 1])) : Vec::zero();
        __m256i ha, la, hb, lb;
        split_bf16(wa, &ha, &la);
        split_bf16(wb, &hb, &lb);
        auto join = [](__m256i a, __m256i b) {  // as _mm512_cvtne2ps_pbh(b, a) lays them out
          return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        };
        _mm512_storeu_si512(s + (jj / 2) * t.rows_pad,
                            _mm512_permutexvar_epi16(interleave, join(ha, hb)));
        _mm512_storeu_si512(scratch + p.scratch.p_lo + (jj / 2) * t.rows_pad + rv * Vec::W,
                            _mm512_permutexvar_epi16(interleave, join(la, lb)));
      } else {
        const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a in the low half
        _mm512_storeu_si512(s + (jj / 2) * t.rows_pad,
                            _mm512_permutexvar_epi16(interleave, halves));
      }
    }
    Vec::store(row_sum + rv * Vec::W, sum);
    Vec::store(row_max + rv * Vec::W, new_max);
  }
}

inline void scale_scores(const TileRows& t, int keys, float scale, float* st) {
  const __m512 s = Vec::set1(scale);
  for (int jj = 0; jj < keys; ++jj) {
    for (int rv = 0; rv < t.row_vecs; ++rv) {
      float* x = st + jj * t.rows_pad + rv * Vec::W;
      Vec::store(x, Vec::mul(Vec::load(x), s));
    }
  }
}

// run_tile (kernel.h) with the products of `Products`:
//   Products::stage_query_pairs(p, req, kv_head, t, scratch), where it has one: the Q^T pairs as
//     stage_query_pairs above writes them (else that function stages them);
//   Products::stage(p, req, kv_head, j0, keys, scratch): K of keys [j0, j0 + keys) in the form
//     its scores read, and the V pairs (stage_value_pairs);
//   Products::steps(p, t, keys): the prefetch steps (NextTilePrefetch::step) its products take;
//   Products::scores(p, t, keys, scratch, visible, pf): S^T [keys][rows_pad] at scratch + st,
//     where a block of rows may stop at the keys it can see (VisibleKeys, f32_products.h);
//   Products::values(p, t, keys, scratch, visible, pf): O^T += V^T P^T from the P pairs over S^T
//     (a block of rows may stop likewise: the keys past it have weight 0 for all its rows);
//   Products::value_scales(), where it has one: each key's V scale, which softmax_pack<true>
//     folds into P (split in two: the P pairs and their low parts at p_lo).
// A task's kernel is run_task<&run_tile_pairs<Products>> (kernel.h).
template <class Products>
inline void run_tile_pairs(const PrefillParams* hp, int heads, const RequestInfo& req, int kv_head,
                           const TileRows& t, float* scratch) {
  Products products;
  for (int h = 0; h < heads; ++h) {
    init_rows(hp[h], req, kv_head + h, t, scratch);
    if constexpr (requires { products.stage_query_pairs(hp[h], req, kv_head, t, scratch); }) {
      products.stage_query_pairs(hp[h], req, kv_head + h, t, scratch);
    } else {
      stage_query_pairs(hp[h], req, kv_head + h, t, scratch);
    }
  }
  const PrefillParams& p0 = hp[0];
  const KeyRange keys = key_range(p0, req, t);
  const bool transform = p0.soft_cap > 0.0f || p0.alibi_slopes_log2e;
  const int kv_tile = p0.tile.kv_tile;
  float* st = scratch + p0.scratch.st;
  NextTilePrefetch pf;
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kv_tile) {
    const int n = static_cast<int>(imin(kv_tile, keys.end - j0));
    pf.plan(p0, req, kv_head, j0 + kv_tile,
            static_cast<int>(imax(0, imin(kv_tile, keys.end - j0 - kv_tile))), heads);
    pf.spread(heads * products.steps(p0, t, n));
    const bool full = j0 >= keys.full_begin && j0 + n <= keys.full_end;
    for (int h = 0; h < heads; ++h) {
      const PrefillParams& p = hp[h];
      const int head = kv_head + h;
      products.stage(p, req, head, j0, n, scratch);
      // Each block of rows over the keys it can see (f32_products.h).
      const VisibleKeys visible = tile_visible_keys(p, full, j0, scratch);
      products.scores(p, t, n, scratch, visible, pf);
      // The dot products see stored q and k: their scales join the score scale. The soft cap and
      // ALiBi act on scaled scores; otherwise the scale rides along the softmax.
      const float k_scale = p.k_head_scale ? p.k_head_scale[head] : p.k_scale;
      const float score_scale = p.q_scale * k_scale * p.qk_scale;
      float softmax_scale = score_scale;
      if (transform) {
        scale_scores(t, n, score_scale, st);
        transform_scores(p, t, j0, n, scratch);
        softmax_scale = 1.0f;
      }
      if (!full) mask_scores(p, req, t, j0, n, scratch);
      if constexpr (requires { products.value_scales(); }) {
        softmax_pack<true>(p, t, n, softmax_scale, scratch, products.value_scales());
      } else {
        softmax_pack(p, t, n, softmax_scale, scratch);
      }
      // The numerics policy (masked_values.h): only a tile that masks a key checks its V.
      auto* vp = reinterpret_cast<uint32_t*>(scratch + p.scratch.vf);
      if (!full && any_non_finite_pairs(vp, int64_t{(n + 1) / 2} * p.head_dim_vo)) {
        add_non_finite_pair_values(n, t.rows, t.rows_pad, p.head_dim_vo,
                                   reinterpret_cast<uint32_t*>(st), vp, scratch + p.scratch.ot);
      }
      products.values(p, t, n, scratch, visible, pf);
    }
    pf.finish();
  }
  for (int h = 0; h < heads; ++h) {
    const PrefillParams& p = hp[h];
    const int head = kv_head + h;
    store_tile(p, req, head, t, p.v_head_scale ? p.v_head_scale[head] : p.v_scale, scratch);
  }
}
