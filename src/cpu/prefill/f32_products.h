// The f32 prefill kernel's products (kernel.h): its two register micro-kernels, S^T = K Q^T and
// O^T += V^T P^T, and the loops that walk them over a tile's strips of row vectors and its keys,
// each strip over the keys it can see (VisibleKeys); with register_blocks, the prefetch steps
// those loops take (which the bf16 kernels' products count too).
//
// Included by kernel.h inside each kernel file's namespace, after NextTilePrefetch, so that each
// ISA's copy is built with its own flags. Needs `Vec` defined.

// The prefetch steps of a tile's products (NextTilePrefetch::spread): one per full register block
// of the scores (kKeyBlock keys) and of the values (kDvBlock columns), per strip of kRowVecs row
// vectors and per row vector past them (each its own strip); the edge blocks take none. (Until
// 2026-12-07 the row vectors past the strips took no value steps and were not counted: a tile of
// 16 rows asked for two thirds of the next tile's lines in one burst at its end, where the
// prefetches stalled on full miss buffers.)
inline int register_blocks(int row_vecs, int keys, int dim_vo) {
  const int strips = row_vecs / Vec::kRowVecs + row_vecs % Vec::kRowVecs;
  return strips * (keys / Vec::kKeyBlock + dim_vo / Vec::kDvBlock);
}

// ---- The two register micro-kernels. KB x RV (resp. DB x RV) accumulators stay in registers.

// S^T[kb][rows] = sum_d K[kb][d] * Q^T[d][rows] for KB keys (rows `pitch` floats apart) and RV
// row vectors.
template <int KB, int RV>
inline void score_block(const float* kf, int dim, int pitch, const float* qt, int64_t rows_pad,
                        float* st) {
  using R = typename Vec::Reg;
  R acc[KB][RV];
  for (int kb = 0; kb < KB; ++kb) {
    for (int rv = 0; rv < RV; ++rv) acc[kb][rv] = Vec::zero();
  }
  for (int d = 0; d < dim; ++d) {
    R q[RV];
    for (int rv = 0; rv < RV; ++rv) q[rv] = Vec::load(qt + d * rows_pad + rv * Vec::W);
    for (int kb = 0; kb < KB; ++kb) {
      const R k = Vec::set1(kf[kb * pitch + d]);
      for (int rv = 0; rv < RV; ++rv) acc[kb][rv] = Vec::fma(k, q[rv], acc[kb][rv]);
    }
  }
  for (int kb = 0; kb < KB; ++kb) {
    for (int rv = 0; rv < RV; ++rv) Vec::store(st + kb * rows_pad + rv * Vec::W, acc[kb][rv]);
  }
}

// O^T[db][rows] += sum_j V[j][db] * P^T[j][rows] for DB value columns (V rows `pitch` floats
// apart) and RV row vectors.
template <int DB, int RV>
inline void value_block(const float* vf, int pitch, const float* pt, int64_t rows_pad, int keys,
                        float* ot) {
  using R = typename Vec::Reg;
  R acc[DB][RV];
  for (int db = 0; db < DB; ++db) {
    for (int rv = 0; rv < RV; ++rv) acc[db][rv] = Vec::load(ot + db * rows_pad + rv * Vec::W);
  }
  for (int j = 0; j < keys; ++j) {
    R pv[RV];
    for (int rv = 0; rv < RV; ++rv) pv[rv] = Vec::load(pt + j * rows_pad + rv * Vec::W);
    for (int db = 0; db < DB; ++db) {
      const R v = Vec::set1(vf[j * pitch + db]);
      for (int rv = 0; rv < RV; ++rv) acc[db][rv] = Vec::fma(v, pv[rv], acc[db][rv]);
    }
  }
  for (int db = 0; db < DB; ++db) {
    for (int rv = 0; rv < RV; ++rv) Vec::store(ot + db * rows_pad + rv * Vec::W, acc[db][rv]);
  }
}

// Row vectors [rv_begin, rv_end) against keys [0, keys): full register blocks, then the edges
// with one row vector or one key at a time.
// The last keys - j < KB keys of a row block in one block of exactly that many keys (a block
// of one key per step would be bound by the loads of Q^T).
template <int RV, int N>
inline void score_tail(int remaining, const float* kf, int dim, int pitch, const float* qt,
                       int64_t rows_pad, float* st) {
  if constexpr (N > 0) {
    if (remaining == N) return score_block<N, RV>(kf, dim, pitch, qt, rows_pad, st);
    score_tail<RV, N - 1>(remaining, kf, dim, pitch, qt, rows_pad, st);
  }
}

// The keys [0, n) of a KV tile from key j0 that the rows up to `last_row` can see at all under
// the causal mask: the products of a tile on the diagonal stop there for a block of rows, since
// each of its rows masks the keys past it (a row's position does not decrease with the row, so
// the last row's bound holds for all; mask_scores writes those scores, their weights are 0). At 64
// prompts of 128 tokens a 32-token tile computed 320 key rows for 258 visible. All n keys where
// there is no causal bound (row_pos null).
struct VisibleKeys {
  const int32_t* row_pos = nullptr;
  int64_t j0 = 0;
  int of(int last_row, int n) const {
    if (row_pos == nullptr) return n;
    const int64_t k = row_pos[last_row] - j0 + 1;
    return static_cast<int>(k < 0 ? 0 : k < n ? k : n);
  }
};

// The bound for the KV tile from key j0: none on a tile every row sees whole (`full`) or without
// a causal mask, else the rows' positions (init_rows).
inline VisibleKeys tile_visible_keys(const PrefillParams& p, bool full, int64_t j0,
                                     const float* scratch) {
  if (full || !p.causal) return {};
  return {reinterpret_cast<const int32_t*>(scratch + p.scratch.row_pos), j0};
}

template <int RV>
inline void score_rows(const float* kf, int dim, int pitch, const float* qt, int64_t rows_pad,
                       int keys, float* st, NextTilePrefetch& pf) {
  constexpr int KB = Vec::kKeyBlock;
  int j = 0;
  for (; j + KB <= keys; j += KB) {
    pf.step();
    score_block<KB, RV>(kf + j * pitch, dim, pitch, qt, rows_pad, st + j * rows_pad);
  }
  score_tail<RV, KB - 1>(keys - j, kf + j * pitch, dim, pitch, qt, rows_pad, st + j * rows_pad);
}

// K rows (dim used) `pitch` floats apart; each block of rows over the keys it can see.
inline void scores(const float* kf, int dim, int pitch, const float* qt, int64_t rows_pad,
                   int row_vecs, int keys, float* st, NextTilePrefetch& pf,
                   const VisibleKeys& visible) {
  constexpr int RV = Vec::kRowVecs, W = Vec::W;
  int rv = 0;
  for (; rv + RV <= row_vecs; rv += RV) {
    score_rows<RV>(kf, dim, pitch, qt + rv * W, rows_pad, visible.of((rv + RV) * W - 1, keys),
                   st + rv * W, pf);
  }
  for (; rv < row_vecs; ++rv) {
    score_rows<1>(kf, dim, pitch, qt + rv * W, rows_pad, visible.of((rv + 1) * W - 1, keys),
                  st + rv * W, pf);
  }
}

// The last dim_vo - d < DB value columns of a row block in one block of exactly that many: one
// column at a time (2 FMAs a key under 3 loads) the AVX2 kernel took 2-4 % longer at d 64 on
// Zen 4 (4 such columns; d 128 has 2: no difference measured).
template <int RV, int N>
inline void value_tail(int remaining, const float* vf, int pitch, const float* pt, int64_t rows_pad,
                       int keys, float* ot) {
  if constexpr (N > 0) {
    if (remaining == N) return value_block<N, RV>(vf, pitch, pt, rows_pad, keys, ot);
    value_tail<RV, N - 1>(remaining, vf, pitch, pt, rows_pad, keys, ot);
  }
}

// V rows (dim_vo used) `pitch` floats apart; each block of rows over the keys it can see (the
// others' weights are 0 for all of its rows).
inline void accumulate_values(const float* vf, int dim_vo, int pitch, const float* pt,
                              int64_t rows_pad, int row_vecs, int keys, float* ot,
                              NextTilePrefetch& pf, const VisibleKeys& visible) {
  constexpr int RV = Vec::kRowVecs, DB = Vec::kDvBlock, W = Vec::W;
  int rv = 0;
  for (; rv + RV <= row_vecs; rv += RV) {
    const float* p = pt + rv * W;
    float* o = ot + rv * W;
    const int seen = visible.of((rv + RV) * W - 1, keys);
    int d = 0;
    for (; d + DB <= dim_vo; d += DB) {
      pf.step();
      value_block<DB, RV>(vf + d, pitch, p, rows_pad, seen, o + d * rows_pad);
    }
    value_tail<RV, DB - 1>(dim_vo - d, vf + d, pitch, p, rows_pad, seen, o + d * rows_pad);
  }
  for (; rv < row_vecs; ++rv) {
    const float* p = pt + rv * W;
    float* o = ot + rv * W;
    const int seen = visible.of((rv + 1) * W - 1, keys);
    int d = 0;
    for (; d + DB <= dim_vo; d += DB) {
      pf.step();
      value_block<DB, 1>(vf + d, pitch, p, rows_pad, seen, o + d * rows_pad);
    }
    value_tail<1, DB - 1>(dim_vo - d, vf + d, pitch, p, rows_pad, seen, o + d * rows_pad);
  }
}
