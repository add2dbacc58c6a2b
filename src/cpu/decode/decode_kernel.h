// The decode kernel, written once over a vector-helper struct S (simd_<isa>.h) and instantiated
// by one file per (vector ISA, KV dtype), decode_kernels_<isa>_<kv>.cc (decode_kernels_by_kv.h),
// and for the scalar level by decode_scalar.cc alone, each with only its ISA's compile flags.
// Everything here is a template on S so that no symbol compiled for one ISA can be linked in place
// of another's.
//
// One task = the work items of one request and KV range over consecutive KV heads. The query
// heads of each GQA group (padded to `group_padded` zero rows) are computed from one pass over
// the K/V rows of the range: per tile of kDecodeTileKeys keys and per head, QK (each K row
// converted once and dotted with every query of the group), the score variants, an
// online-softmax step in fp32 (base 2), then PV. Walking all heads of a tile before the next
// tile reads each token's rows of all heads together: in the NHD layout that is one contiguous
// block per token, which streams from DRAM far better than one head's 256-byte slices.
// FP8 rows are widened in registers to raw f32 (simd_avx512.h); the raw factor and the tensor
// scale are applied once per tile to the scores and once per item to the output.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/element_io.h"
#include "core/math_constants.h"
#include "core/numeric.h"
#include "cpu/common/convert_row.h"
#include "cpu/decode/decode.h"
#include "cpu/decode/decode_fma_tiles.h"
#include "cpu/decode/decode_prefetch.h"
#include "cpu/decode/decode_softmax.h"
#include "cpu/decode/decode_steps.h"

namespace kvattn::cpu::decode_detail {

// llama RoPE of x[0, dim) with cos/sin of each pair t given.
template <class S>
void rotate(float* x, int dim, bool interleave, const double* cos_t, const double* sin_t) {
  const int half = dim / 2;
  for (int t = 0; t < half; ++t) {
    float& x1 = interleave ? x[2 * t] : x[t];
    float& x2 = interleave ? x[2 * t + 1] : x[t + half];
    const double a = x1, b = x2;
    x1 = static_cast<float>(a * cos_t[t] - b * sin_t[t]);
    x2 = static_cast<float>(b * cos_t[t] + a * sin_t[t]);
  }
}

// The first key a work item's task reads: its range's, or the window's where that starts later.
inline int64_t first_key(const DecodeParams& p, const WorkItem& w) {
  const int64_t q_pos = p.kv_len[w.request] - 1;  // decode: the query is the last position
  return p.window_left >= 0 ? std::max(w.kv_begin, q_pos - p.window_left) : w.kv_begin;
}

// Row addresses of keys [j0, j0 + n) of request b, KV head h; with per-(token, head) scales
// (k_off non-null) also where each key's scales of head 0 sit.
template <class S>
void row_pointers(const DecodeParams& p, int b, int h, int64_t j0, int n, std::size_t elem_bytes,
                  const std::byte** k_rows, const std::byte** v_rows, int64_t* k_off,
                  int64_t* v_off) {
  const int64_t first_page = p.kv_indptr[b * p.indptr_stride];
  int64_t page_index = j0 / p.page_size, slot = j0 % p.page_size;
  int64_t page = p.kv_indices[(first_page + page_index) * p.indices_stride];
  for (int i = 0; i < n; ++i) {
    k_rows[i] = p.k + p.k_strides.offset(page, slot, h, 0) * static_cast<int64_t>(elem_bytes);
    v_rows[i] = p.v + p.v_strides.offset(page, slot, h, 0) * static_cast<int64_t>(elem_bytes);
    if (k_off) {
      k_off[i] = p.ks_strides.offset(page, slot, 0, 0);
      v_off[i] = p.vs_strides.offset(page, slot, 0, 0);
    }
    if (++slot == p.page_size && i + 1 < n) {
      slot = 0;
      ++page_index;
      page = p.kv_indices[(first_page + page_index) * p.indices_stride];
    }
  }
}

// The vector ISAs widen e4m3 by bit placement, which reads the NaN code S.1111.111 as 480. The
// reference's NaN semantics are restored here, after the tile's PV: a visible key whose K row
// holds a NaN code makes the head's rows NaN (flagged for the epilogue), a NaN code in a visible
// V row makes that output column NaN. The scan costs ~2 instructions per 32 or 64 codes: the
// tile's rows at once (one maximum across them); only a tile whose V rows hold a NaN code is
// walked key by key. (A check per row, its compare and branch each time, took ~9 % of the AVX2
// kernel's e4m3 decode cache-resident on Zen 5.) The output columns are where Tiles keeps them
// until finish_o (Tiles::o_position). k_nan_code / v_nan_code: whether the K / V rows may hold
// the code at all (false where the tiles probed every row and found none: no scan). The AVX2
// quad tiles probe the codes as they read them (S::load_e4m3_quads): on Zen 3 this scan, reading
// the rows again, took ~11 % of e4m3 decode cache-resident (one thread, 2048 keys).
template <class S, class Tiles>
void poison_e4m3_nans(const DecodeParams& p, const std::byte* const* k_rows,
                      const std::byte* const* v_rows, int n, const uint8_t* visible,
                      bool k_nan_code, bool v_nan_code, float* o, int o_row, uint8_t* nan_key) {
  if (!p.rope && k_nan_code && S::has_e4m3_nan_rows(k_rows, n, visible, p.head_dim_qk)) {
    *nan_key = 1;
  }
  if (!v_nan_code || !S::has_e4m3_nan_rows(v_rows, n, visible, p.head_dim_vo)) return;
  for (int kk = 0; kk < n; ++kk) {
    if (visible && !visible[kk]) continue;
    if (S::has_e4m3_nan_rows(v_rows + kk, 1, nullptr, p.head_dim_vo)) {
      const auto* codes = reinterpret_cast<const uint8_t*>(v_rows[kk]);
      for (int d = 0; d < p.head_dim_vo; ++d) {
        if ((codes[d] & 0x7F) != 0x7F) continue;
        for (int g = 0; g < p.group; ++g)
          o[g * o_row + Tiles::o_position(d)] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
}

// The decode of one task (decode_task, below) with steps of kStepHeads heads (takes_head_steps)
// and its heads past a multiple of kStepHeads one a step, or one head a step where kStepHeads is 1.
template <class S, DType kKV, int kDqk, int kDvo, int kNG, class Tiles, int kStepHeads>
[[gnu::noinline]] void decode_task_by_steps(const DecodeParams& p, const WorkItem* items,
                                            int num_heads, bool first_tile_asked,
                                            const NextDecodeTask& next, std::byte* scratch) {
  const DecodeScratchLayout layout =
      DecodeScratchLayout::make(p.group_padded, p.head_dim_qk_padded, p.head_dim_vo_padded, p.rope,
                                p.k_token_scale != nullptr);
  const int group = p.group, gp = p.group_padded;
  const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const int q_row = p.head_dim_qk_padded, o_row = p.head_dim_vo_padded;
  // Per head of the task: its queries, output accumulators, running max and sum.
  const int q_head = gp * q_row, o_head = gp * o_row;
  float* q_all = reinterpret_cast<float*>(scratch + layout.q);
  float* o_all = reinterpret_cast<float*>(scratch + layout.o);
  float* max_all = reinterpret_cast<float*>(scratch + layout.max);
  float* sum_all = reinterpret_cast<float*>(scratch + layout.sum);
  float* scores = reinterpret_cast<float*>(scratch + layout.scores);
  // Row addresses of the first head of the task, double-buffered for the next tile.
  auto* k_rows = reinterpret_cast<const std::byte**>(scratch + layout.k_rows);  // [2][kTile]
  auto* v_rows = reinterpret_cast<const std::byte**>(scratch + layout.v_rows);
  auto* head_rows = reinterpret_cast<const std::byte**>(scratch + layout.head_rows);  // [2][kTile]
  auto* visible = reinterpret_cast<uint8_t*>(scratch + layout.mask);
  // Per head: a visible key was the e4m3 NaN code (the reference's row is then NaN).
  auto* nan_key = reinterpret_cast<uint8_t*>(scratch + layout.nan_key);
  // Per-(token, head) scales: offsets of each key's scales (head 0) per K/V, double-buffered like
  // the rows, and the current head's scales of the tile.
  const bool token_scales = p.k_token_scale != nullptr;
  int64_t* k_off =
      token_scales ? reinterpret_cast<int64_t*>(scratch + layout.scale_offsets) : nullptr;
  int64_t* v_off = token_scales ? k_off + 2 * kTile : nullptr;
  float* key_scale =
      token_scales ? reinterpret_cast<float*>(scratch + layout.token_scales) : nullptr;
  float* value_scale = token_scales ? key_scale + kTile : nullptr;

  const WorkItem& w = items[0];
  const int b = w.request, h0 = w.kv_head;
  const int64_t kv_len = p.kv_len[b];
  const int64_t q_pos = kv_len - 1;  // decode: the query is the last position

  // Rope (tasks of one head): inverse frequencies and cos/sin advanced one position per key.
  double* inv_freq = nullptr;
  double *cos_t = nullptr, *sin_t = nullptr, *cos_step = nullptr, *sin_step = nullptr;
  float* rope_k = nullptr;
  const int half = dqk / 2;
  if (p.rope) {
    auto* tables = reinterpret_cast<double*>(scratch + layout.rope_cos_sin);
    inv_freq = tables;
    cos_t = tables + half;
    sin_t = tables + 2 * half;
    cos_step = tables + 3 * half;
    sin_step = tables + 4 * half;
    rope_k = reinterpret_cast<float*>(scratch + layout.rope_k);
    for (int t = 0; t < half; ++t) {
      inv_freq[t] = std::pow(p.rope_theta, -2.0 * t / dqk) / p.rope_scale;
      cos_step[t] = std::cos(inv_freq[t]);
      sin_step[t] = std::sin(inv_freq[t]);
    }
  }

  // Prologue: each head's queries in f32, dequantized and rotated; padding zero.
  std::fill(q_all, q_all + num_heads * q_head, 0.0f);
  const int64_t q_bytes = static_cast<int64_t>(dtype_size(p.q_dtype));
  for (int hi = 0; hi < num_heads; ++hi) {
    for (int g = 0; g < group; ++g) {
      const int qo_head = (h0 + hi) * group + g;
      const std::byte* src = p.q + (b * p.q_stride_b + qo_head * p.q_stride_h) * q_bytes;
      float* dst = q_all + hi * q_head + g * q_row;
      // By the ISA's vectors (one element at a time this was ~40 % of a decode over 16 keys).
      load_row_as_f32<S>(src, p.q_dtype, dqk, p.q_stride_d, p.q_scale, dst);
      if (p.rope) {
        for (int t = 0; t < half; ++t) {
          cos_t[t] = std::cos(static_cast<double>(q_pos) * inv_freq[t]);
          sin_t[t] = std::sin(static_cast<double>(q_pos) * inv_freq[t]);
        }
        rotate<S>(dst, dqk, p.rope_interleave, cos_t, sin_t);
      }
    }
  }
  // (Fused RoPE rotates K rows into f32 and runs the plain f32 QK tile on the queries as they are.)
  // The scores' raw-to-real factor: the tiles' K factor, or what fold_q made it.
  float k_raw = p.rope ? 1.0f : Tiles::kKRaw;
  if (!p.rope) {
    for (int hi = 0; hi < num_heads; ++hi) Tiles::prepare_q(q_all + hi * q_head, gp, q_row, dqk);
    if constexpr (requires { Tiles::fold_q(q_all, gp, q_row, dqk); }) {
      k_raw = Tiles::fold_q(q_all, num_heads * gp, q_row, dqk);
    }
  }
  std::fill(o_all, o_all + num_heads * o_head, 0.0f);
  std::fill(max_all, max_all + num_heads * gp, kNegInf);
  std::fill(sum_all, sum_all + num_heads * gp, 0.0f);
  std::fill(nan_key, nan_key + num_heads, uint8_t{0});

  const int64_t begin = first_key(p, w), end = w.kv_end;

  constexpr std::size_t kv_bytes = kElemBytes<kKV>;
  const int64_t k_row_bytes = p.k_strides.dim == 1 ? dqk * int64_t{kv_bytes} : 0;
  const int64_t v_row_bytes = p.v_strides.dim == 1 ? dvo * int64_t{kv_bytes} : 0;
  const int64_t k_head_step = p.k_strides.head * int64_t{kv_bytes};
  const int64_t v_head_step = p.v_strides.head * int64_t{kv_bytes};
  TilePrefetcher prefetch(p.prefetch.hint);
  // tick() calls per head step: one per key in each QK and PV pass over a block of kNG rows.
  const int ticks_per_head = 2 * kTile * ((gp + kNG - 1) / kNG);
  // Heads a step takes together: kStepHeads (Tiles::kStepHeads where takes_head_steps, else 1);
  // the task's heads past a multiple of it in a step of kTailStepHeads where they are that many,
  // the rest one a step, in the same walk of the keys. The next tile's lines are shared out by
  // heads (a step of 8 heads asks for 8 heads' share).
  static_assert(kStepHeads >= 1 && kStepHeads <= kDecodeMaxStepHeads);
  constexpr int kTailStepHeads = kStepHeads > 1 ? tail_step_heads<Tiles>() : 1;
  static_assert(kTailStepHeads == 1 || kTailStepHeads < kStepHeads);
  // The prefetch plan of a tile (`count` keys, rows of its task's first head): its K and V bytes
  // of `heads` heads, as streams in address order: K before V, token-major where a token's heads
  // are adjacent (NHD), else head-major (HND).
  auto plan_tile = [&](const std::byte* const* tile_k, const std::byte* const* tile_v, int count,
                       int heads) {
    prefetch.reset();
    if (count > 0 && k_row_bytes > 0 && v_row_bytes > 0) {
      // K and V rows of a token side by side (vLLM's CPU cache [blocks, H, block, 2D]: K and V
      // the two halves of each row): one stream of both rows, which then runs on across the
      // page's tokens. Taken as two strided streams they were one stream per key and K/V (more
      // than the table holds): decode over that cache took 1.8x the time of separate K and V.
      const int64_t pair_bytes = k_row_bytes + v_row_bytes;
      const bool side_by_side = p.v == p.k + k_row_bytes && p.k_strides.page == p.v_strides.page &&
                                p.k_strides.slot == p.v_strides.slot && k_head_step == v_head_step;
      const bool token_major = side_by_side
                                   ? k_head_step == pair_bytes
                                   : k_head_step == k_row_bytes && v_head_step == v_row_bytes;
      for (const bool is_v : {false, true}) {
        if (is_v && side_by_side) break;
        const std::byte* const* rows = is_v ? tile_v : tile_k;
        const int64_t row_bytes = side_by_side ? pair_bytes : is_v ? v_row_bytes : k_row_bytes;
        const int64_t head_step = is_v ? v_head_step : k_head_step;
        if (token_major) {
          // NHD: a page's rows of the task's heads are contiguous and merge into one stream a
          // page, which the walk reads token by token. (A stream per token row, the walk then
          // asking for head 0's lines of every token first, was Zen 3 / Zen 4's until 2026-12-05
          // and is gone: DecodePrefetch, core/cpu_features.h.)
          for (int kk = 0; kk < count; ++kk) prefetch.add(rows[kk], heads * row_bytes);
        } else {
          // HND: per run of keys in one page, each head's rows are contiguous, and a full page
          // of all heads is one block: added page by page, head by head, they merge into one
          // stream per page as NHD's do (32 streams at 4 KiB strides ran at half the rate).
          const int64_t token_step =
              (is_v ? p.v_strides.slot : p.k_strides.slot) * static_cast<int64_t>(kv_bytes);
          for (int k0 = 0; k0 < count;) {
            int k1 = k0 + 1;
            if (token_step == row_bytes) {
              while (k1 < count && rows[k1] == rows[k1 - 1] + token_step) ++k1;
            }
            for (int hi = 0; hi < heads; ++hi) {
              prefetch.add(rows[k0] + hi * head_step, (k1 - k0) * row_bytes);
            }
            k0 = k1;
          }
        }
      }
    }
    prefetch.seal();
  };
  if (begin < end) {
    const int first_n = static_cast<int>(std::min<int64_t>(kTile, end - begin));
    row_pointers<S>(p, b, h0, begin, first_n, kv_bytes, k_rows, v_rows, k_off, v_off);
    // The first tile has no tile before it to hide behind: its lines are asked for at once, in
    // address order, before its head steps read them head by head (64 requests x 256 keys,
    // where it is 1 tile in 8: 5-9 % faster on Zen 4; read on demand, the strided head rows
    // leave few lines in flight). Where the task before it on the thread asked for them during
    // its last tile (NextDecodeTask), not again: that burst, lines already on their way or in
    // L2, took ~6 % of a 256-key request's time on Zen 4.
    if (!first_tile_asked) {
      plan_tile(k_rows, v_rows, first_n, num_heads);
      prefetch.begin_step(0, 1, 0);
      prefetch.finish_step();
    }
  }
  for (int64_t j0 = begin, t = 0; j0 < end; j0 += kTile, ++t) {
    const int n = static_cast<int>(std::min<int64_t>(kTile, end - j0));
    const std::byte** kr = k_rows + (t & 1) * kTile;
    const std::byte** vr = v_rows + (t & 1) * kTile;
    const std::byte** next_k = k_rows + ((t + 1) & 1) * kTile;
    const std::byte** next_v = v_rows + ((t + 1) & 1) * kTile;
    const int next_n = static_cast<int>(std::clamp<int64_t>(end - j0 - kTile, 0, kTile));
    const int64_t* tile_k_off = token_scales ? k_off + (t & 1) * kTile : nullptr;
    const int64_t* tile_v_off = token_scales ? v_off + (t & 1) * kTile : nullptr;
    if (next_n > 0) {
      row_pointers<S>(p, b, h0, j0 + kTile, next_n, kv_bytes, next_k, next_v,
                      token_scales ? k_off + ((t + 1) & 1) * kTile : nullptr,
                      token_scales ? v_off + ((t + 1) & 1) * kTile : nullptr);
      plan_tile(next_k, next_v, next_n, num_heads);
    } else {
      // The last tile: the next task's first tile (its lines only; that task finds its rows
      // again), so that a short request's first tile is not read on demand.
      int first = 0;
      if (next.items != nullptr) {
        const WorkItem& nw = next.items[0];
        const int64_t next_begin = first_key(p, nw);
        first = static_cast<int>(std::clamp<int64_t>(nw.kv_end - next_begin, 0, kTile));
        if (first > 0) {
          row_pointers<S>(p, nw.request, nw.kv_head, next_begin, first, kv_bytes, next_k, next_v,
                          nullptr, nullptr);
        }
      }
      plan_tile(next_k, next_v, first, first > 0 ? next.num_heads : num_heads);
    }

    const uint8_t* tile_visible = nullptr;
    // The keys of the tile the custom mask shows (the same for every row of a decode request):
    // PV runs over these only. The numerics policy (docs/cuda.md): a hidden key's zero weight
    // times an inf or NaN V would be NaN; skipping it changes nothing else (its terms are 0).
    int shown[kTile];
    const std::byte* shown_rows[kTile];
    int num_shown = n;
    if (p.mask) {
      const int64_t first = p.mask_begin[b] + j0;
      num_shown = 0;
      for (int kk = 0; kk < n; ++kk) {
        const int64_t e = first + kk;
        visible[kk] = p.mask_packed ? (p.mask[(e >> 3) * p.mask_stride] >> (e & 7)) & 1
                                    : p.mask[e * p.mask_stride] != 0;
        if (visible[kk]) shown[num_shown++] = kk;
      }
      tile_visible = visible;
    }

    // The plain path's logits of rows whose K scale is k_scale: the scale applied and the max
    // taken in one pass, the lanes past n -inf.
    auto plain_logits = [&](float k_scale) {
      const auto raw = S::set1(k_raw), scale = S::set1(k_scale * p.sm_scale * kLog2e);
      return [raw, scale, n](int, float* s) {
        auto mx = S::set1(kNegInf);
        for (int kb = 0; kb < n; kb += S::kWidth) {
          auto x = S::mul(S::mul(S::load(s + kb), raw), scale);
          S::store(s + kb, x);
          if (kb + S::kWidth > n) {
            std::fill(s + n, s + kb + S::kWidth, kNegInf);
            x = S::load(s + kb);
          }
          mx = S::max(mx, x);
        }
        return mx;
      };
    };

    // One step: hs adjacent heads from hi. Always inline, as GCC's attribute (it ignores
    // [[gnu::always_inline]] there): left out of line in one instance, the fp32-FMA kernel's f16
    // over HND read 0.84x cache-resident on Zen 5 (its captures reloaded through the closure).
    auto take_step = [&]<int hs>(int hi) __attribute__((always_inline)) {
      float* q = q_all + hi * q_head;
      float* o = o_all + hi * o_head;
      const std::byte** hk = head_rows;
      const std::byte** hv = head_rows + kTile;
      for (int kk = 0; kk < n; ++kk) {
        hk[kk] = kr[kk] + hi * k_head_step;
        hv[kk] = vr[kk] + hi * v_head_step;
      }
      using Step = typename StepTiles<hs, Tiles>::type;
      // (Two branches on hs: the one-head step's QK below hangs on `else if (p.rope)`.)
      if constexpr (hs > 1) {
        prefetch.begin_step(hi + hs - 1, num_heads, Step::step_ticks(gp, hs));
      } else {
        prefetch.begin_step(hi, num_heads, ticks_per_head);
      }
      // Whether each head's K and V rows of the tile may hold the e4m3 NaN code (the tiles tell
      // where they probed them: Tiles::kPoisonE4m3Nans).
      bool k_nan_code[hs], v_nan_code[hs];
      std::fill(k_nan_code, k_nan_code + hs, true);
      std::fill(v_nan_code, v_nan_code + hs, true);
      if constexpr (hs > 1) {
        Step::template qk_step<hs>(q, q_row, q_head, gp, hk, k_head_step, n, dqk, scores,
                                   &prefetch);
      } else if (p.rope) {
        for (int kk = 0; kk < n; ++kk) {
          float* dst = rope_k + kk * q_row;
          for (int d = 0; d < dqk; ++d) {
            dst[d] = io::load_f32<S>(hk[kk], p.kv_dtype, d * p.k_strides.dim);
          }
          if (kk == 0) {
            for (int tt = 0; tt < half; ++tt) {
              cos_t[tt] = std::cos(static_cast<double>(j0) * inv_freq[tt]);
              sin_t[tt] = std::sin(static_cast<double>(j0) * inv_freq[tt]);
            }
          } else {
            for (int tt = 0; tt < half; ++tt) {
              const double c = cos_t[tt], s = sin_t[tt];
              cos_t[tt] = c * cos_step[tt] - s * sin_step[tt];
              sin_t[tt] = s * cos_step[tt] + c * sin_step[tt];
            }
          }
          rotate<S>(dst, dqk, p.rope_interleave, cos_t, sin_t);
          hk[kk] = reinterpret_cast<const std::byte*>(dst);
        }
        qk_tile<S, DType::kF32, kDqk, kNG>(q, q_row, gp, hk, n, dqk, 1, scores, &prefetch);
      } else if constexpr (Tiles::kPoisonE4m3Nans) {
        k_nan_code[0] = Tiles::qk(q, q_row, gp, hk, n, dqk, p.k_strides.dim, scores, &prefetch);
      } else {
        Tiles::qk(q, q_row, gp, hk, n, dqk, p.k_strides.dim, scores, &prefetch);
      }

      // The online-softmax step of each head of the step (its scores j * gp rows on). Where the
      // heads' rows lie back to back (no padded rows) and share one score scale, the plain path
      // takes all of them in one call: one exp2 of the rescale factors for 16 rows, not one a
      // head.
      bool any_head[hs] = {};
      const bool one_softmax = hs > 1 && gp == group && !token_scales && !p.general_scores() &&
                               p.k_head_scale == nullptr;
      if (one_softmax) {
        softmax_rows<S>(scores, hs * group, n, plain_logits(p.k_scale), nullptr, max_all + hi * gp,
                        sum_all + hi * gp, o, o_row);
        // A head takes PV where one of its rows has seen a visible key.
        for (int j = 0; j < hs; ++j) {
          const float* row_max = max_all + (hi + j) * gp;
          any_head[j] = std::any_of(row_max, row_max + group, [](float m) { return m != kNegInf; });
        }
      }
      for (int j = 0; j < (one_softmax ? 0 : hs); ++j) {
        const int h = h0 + hi + j;
        float* head_scores = scores + j * gp * kTile;
        float* row_max = max_all + (hi + j) * gp;
        float* row_sum = sum_all + (hi + j) * gp;
        float* head_o = o + j * o_head;
        if (token_scales) {
          const float* ks = p.k_token_scale + h * p.ks_strides.head;
          const float* vs = p.v_token_scale + h * p.vs_strides.head;
          for (int kk = 0; kk < n; ++kk) {
            key_scale[kk] = ks[tile_k_off[kk]];
            value_scale[kk] = vs[tile_v_off[kk]];
          }
          for (int kk = n; kk < kTile; ++kk) key_scale[kk] = value_scale[kk] = 0.0f;
        }
        const float k_scale = p.k_head_scale ? p.k_head_scale[h] : p.k_scale;
        bool any;
        if (!p.general_scores() && !token_scales) {
          any = softmax_rows<S>(head_scores, group, n, plain_logits(k_scale), nullptr, row_max,
                                row_sum, head_o, o_row);
        } else {
          any = softmax_rows<S>(
              head_scores, group, n,
              [&](int g, float* s) {
                const float slope = p.alibi_slopes ? p.alibi_slopes[h * group + g] : 0.0f;
                transform_scores<S>(p, s, n, j0, q_pos, slope, tile_visible, k_raw, k_scale,
                                    key_scale);
                auto mx = S::set1(kNegInf);
                for (int kb = 0; kb < n; kb += S::kWidth) mx = S::max(mx, S::load(s + kb));
                return mx;
              },
              token_scales ? value_scale : nullptr, row_max, row_sum, head_o, o_row);
        }
        any_head[j] = any;
        if (any) {
          for (int g = group; g < gp; ++g) {
            std::fill(head_scores + g * kTile, head_scores + (g + 1) * kTile, 0.0f);
          }
        }
      }

      // PV of a step's heads together where every one of them saw a visible key (the padded
      // rows' weights are zero: set above, or none with one_softmax); else head by head (a head
      // that saw no visible key is skipped: its weights are zero, but a zero weight times an inf
      // or NaN V row would not be).
      bool step_pv = false;
      if constexpr (hs > 1) {
        step_pv =
            num_shown == n && std::all_of(any_head, any_head + hs, [](bool seen) { return seen; });
        if (step_pv) {
          Step::template pv_step<hs>(scores, gp, hv, v_head_step, n, dvo, p.v_strides.dim, o, o_row,
                                     o_head, &prefetch, token_scales);
        }
      }
      for (int j = 0; j < (step_pv ? 0 : hs); ++j) {
        if (!any_head[j]) continue;
        if (j > 0) {
          for (int kk = 0; kk < n; ++kk) hv[kk] = vr[kk] + (hi + j) * v_head_step;
        }
        float* head_scores = scores + j * gp * kTile;
        const std::byte* const* pv_rows = hv;
        if (num_shown < n) {
          // The shown keys' weights and V rows, moved to the front (shown[m] >= m: in place).
          for (int m = 0; m < num_shown; ++m) shown_rows[m] = hv[shown[m]];
          for (int g = 0; g < group; ++g) {
            float* s = head_scores + g * kTile;
            for (int m = 0; m < num_shown; ++m) s[m] = s[shown[m]];
          }
          pv_rows = shown_rows;
        }
        if constexpr (split_weights<Tiles>()) {
          if (token_scales) {
            Tiles::template pv<true>(head_scores, gp, pv_rows, num_shown, dvo, p.v_strides.dim,
                                     o + j * o_head, o_row, &prefetch);
            continue;
          }
        }
        if constexpr (Tiles::kPoisonE4m3Nans) {
          v_nan_code[j] = Tiles::pv(head_scores, gp, pv_rows, num_shown, dvo, p.v_strides.dim,
                                    o + j * o_head, o_row, &prefetch);
        } else {
          Tiles::pv(head_scores, gp, pv_rows, num_shown, dvo, p.v_strides.dim, o + j * o_head,
                    o_row, &prefetch);
        }
      }
      prefetch.finish_step();
      if constexpr (Tiles::kPoisonE4m3Nans) {
        // Each head of the step after all of their PV (hk, hv: its rows again).
        for (int j = 0; j < hs; ++j) {
          if (!any_head[j]) continue;
          if (hs > 1) {
            for (int kk = 0; kk < n; ++kk) {
              hk[kk] = kr[kk] + (hi + j) * k_head_step;
              hv[kk] = vr[kk] + (hi + j) * v_head_step;
            }
          }
          poison_e4m3_nans<S, Tiles>(p, hk, hv, n, tile_visible, k_nan_code[j], v_nan_code[j],
                                     o + j * o_head, o_row, &nan_key[hi + j]);
        }
      }
    };
    int hi = 0;
    if constexpr (kStepHeads > 1) {
      for (; hi + kStepHeads <= num_heads; hi += kStepHeads) {
        take_step.template operator()<kStepHeads>(hi);
      }
    }
    if constexpr (kTailStepHeads > 1) {
      if (hi + kTailStepHeads <= num_heads) {
        take_step.template operator()<kTailStepHeads>(hi);
        hi += kTailStepHeads;
      }
    }
    for (; hi < num_heads; ++hi) take_step.template operator()<1>(hi);
  }

  // Epilogue (common/epilogue.h): normalize, undo the V raw factor, write the output or the
  // partial state.
  for (int hi = 0; hi < num_heads; ++hi) Tiles::finish_o(o_all + hi * o_head, gp, o_row, dvo);
  for (int hi = 0; hi < num_heads; ++hi) {
    const int h = h0 + hi;
    const WorkItem& item = items[hi];
    const float v_scale = (p.v_head_scale ? p.v_head_scale[h] : p.v_scale) * Tiles::kVRaw;
    for (int g = 0; g < group; ++g) {
      const int qo_head = h * group + g;
      float* acc = o_all + hi * o_head + g * o_row;
      const bool final_row = item.partial < 0;
      const math::RowFinish fin =
          finish_row(max_all[hi * gp + g], sum_all[hi * gp + g], v_scale, nan_key[hi] != 0,
                     final_row && p.sinks ? p.sinks + qo_head : nullptr);
      // A row that saw no key writes zeros, whatever its accumulator holds.
      for (int d = 0; d < dvo; ++d) acc[d] = fin.o_scale == 0.0f ? 0.0f : acc[d] * fin.o_scale;
      if (final_row) {
        p.output.store_with<S>(b, qo_head, acc, dvo, fin.lse);
      } else {
        std::copy(acc, acc + dvo, p.partial.row(item.partial, g));
        p.partial.lse_of(item.partial, g) = fin.lse;
      }
    }
  }
}

// The decode of one task (a request's KV heads items[0].kv_head.. + num_heads over one KV range):
// by steps of Tiles::kStepHeads heads where it takes them (takes_head_steps), else one head a step,
// each its own function. Compiled into one, the step code changed GCC's code for the one-head
// loops (their loop-invariant pointers reloaded from the stack): the fp32-FMA kernel with f16 over
// HND caches, cache-resident on one Zen 5 thread, read 26.2-26.4 GB/s against 31.3 apart (NHD
// one head a step 25.6 against 29.0), the bf16-dot kernel 34.1-34.6 against 35.5-35.6.
template <class S, DType kKV, int kDqk, int kDvo, int kNG,
          class Tiles = FmaTiles<S, kKV, kDqk, kDvo, kNG>>
void decode_task(const DecodeParams& p, const WorkItem* items, int num_heads, bool first_tile_asked,
                 const NextDecodeTask& next, std::byte* scratch) {
  constexpr int kStepHeads = step_heads<Tiles>();
  if constexpr (kStepHeads > 1) {
    // The task's heads past a multiple of kStepHeads one a step, in the same walk of the keys.
    // (In a second walk of their own, 12 KV heads of group 4 (a step of 8, then 4) read 12.6 GB/s
    // from DRAM on one Zen 5 thread, bf16 d128, where HND read 30: that walk's rows were 1 KiB of
    // each 3 KiB token row, and the first walk's prefetch had not asked for them.)
    constexpr int kFewestStepHeads =
        tail_step_heads<Tiles>() > 1 ? tail_step_heads<Tiles>() : kStepHeads;
    if (num_heads >= kFewestStepHeads && takes_head_steps<S, kKV, kDqk, kDvo, kNG, Tiles>(p)) {
      decode_task_by_steps<S, kKV, kDqk, kDvo, kNG, Tiles, kStepHeads>(
          p, items, num_heads, first_tile_asked, next, scratch);
      return;
    }
  }
  decode_task_by_steps<S, kKV, kDqk, kDvo, kNG, Tiles, 1>(p, items, num_heads, first_tile_asked,
                                                          next, scratch);
}

}  // namespace kvattn::cpu::decode_detail
