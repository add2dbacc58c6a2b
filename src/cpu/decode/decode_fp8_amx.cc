// Decode over an FP8 (e4m3 / e5m2) cache for bf16 queries on AMX-BF16 tiles (Sapphire Rapids and
// later): the decode kernel of decode_kernel.h with the FP8 table widening of decode_fp8_table.h
// (exact to bf16, 64 codes per 5 instructions) and both products on TDPBF16PS, where the
// vdpbf16ps of the table kernel retires at a quarter of the FMA rate on the Intel Xeons measured
// (issue 14) and the fp32-FMA table kernel is compute-bound:
//   S^T[16 keys x G rows] += K[16 keys x 32 dims] . Q^T pairs[16 dim pairs x G rows x 2]
//     (A: the tile's K rows widened into a staging buffer, in the table's word order; B: the
//     query rows of the GQA group, staged once per head by prepare_q in the same order),
//   O[G rows x 16 dims] += P[G rows x 32 keys] . V pairs[16 key pairs x 16 dims x 2]
//     (A: the probabilities in bf16; B: two keys' V rows interleaved by the table widening's
//     pairs(), dims in the dot-product tiles' accumulator order, put back by finish_o),
// G = the padded group (1, 2, 4, 8 or 16 rows). O stays in the decode kernel's accumulators,
// loaded and stored by the tiles once per 32-key tile. NaN codes widen to bf16 NaN and reach the
// products as in the table kernel (no custom mask: decode_kernel.h's rule for these tiles).
//
// Built twice (src/cpu/CMakeLists.txt): with the AMX flags, and with KVATTN_AMX_EMULATED on
// emulated tiles (common/amx.h) for the tests on CPUs without AMX.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/common/amx.h"
#include "cpu/decode/decode.h"
#include "cpu/decode/decode_fp8_table.h"

namespace kvattn::cpu {
namespace {

// The tiles: 0 S^T (16 keys x G rows, f32), 2 a block of O (G rows x 16 dims, f32), 4 K (16
// keys x 32 dims, bf16), 5 P (G rows x 32 keys, bf16), 6 Q^T pairs (16 dim pairs x G rows),
// 7 V pairs (16 key pairs x 16 dims).
template <int kG>
void load_decode_tile_config() {
  amx::TileConfig cfg;
  const auto set = [&cfg](int tile, int rows, int row_bytes) {
    cfg.rows[tile] = static_cast<uint8_t>(rows);
    cfg.colsb[tile] = static_cast<uint16_t>(row_bytes);
  };
  set(0, 16, 4 * kG);
  set(2, kG, 64);
  set(4, 16, 64);
  set(5, kG, 64);
  set(6, 16, 4 * kG);
  set(7, 16, 64);
  _tile_loadconfig(&cfg);
}

template <DType kKV, int kD, int kG>
struct AmxTiles {
  static_assert(kD % 64 == 0 && kG <= 16);
  using Loader = Fp8TableLoader<kKV>;
  using Dot = decode_detail::DotTiles<Loader, kD, kG>;  // its finish_o: the same output order
  static constexpr int kChunks = kD / 64;
  static constexpr int kSlices = kD / 32;  // 32 dims: one K tile's row
  static constexpr float kKRaw = 1.0f;
  static constexpr float kVRaw = 1.0f;
  static constexpr bool kPoisonE4m3Nans = false;

  // The G query rows as the B tiles of QK, written over the start of the rows (2 D G bytes of
  // the 4 D G they hold): slice s, dim pair i, row g holds the bf16 of the two dims whose K words
  // sit at 32 s + 2 i and 32 s + 2 i + 1 of a staged K row (Loader::word). Also configures the
  // tiles for this task's heads (finish_o releases them).
  static void prepare_q(float* q, int rows, int q_row, int dqk) {
    float tmp[kG][kD];
    for (int g = 0; g < rows; ++g) std::memcpy(tmp[g], q + g * q_row, sizeof(float) * dqk);
    auto* words = reinterpret_cast<uint16_t*>(q);
    for (int d = 0; d < kD; ++d) {
      const int pos = d / 64 * 64 + Loader::word(d % 64);
      const int pair = pos / 2, half = pos % 2;  // pair = 16 s + i
      for (int g = 0; g < kG; ++g) words[(pair * kG + g) * 2 + half] = num::f32_to_bf16(tmp[g][d]);
    }
    load_decode_tile_config<kG>();
  }

  static void qk(const float* q, int, int, const std::byte* const* rows, int n, int, int64_t,
                 float* scores, decode_detail::TilePrefetcher* prefetch) {
    using decode_detail::kTile;
    alignas(64) uint16_t k_rows[kTile][kD];
    alignas(64) float s_t[kTile][kG];
    const Loader load;
    for (int kk = 0; kk < n; ++kk) {
      prefetch->tick();
      const auto* row = reinterpret_cast<const uint8_t*>(rows[kk]);
      for (int c = 0; c < kChunks; ++c) {
        __m512i w0, w1;
        load(row + c * Loader::kChunkBytes, &w0, &w1);
        _mm512_store_si512(&k_rows[kk][64 * c], w0);
        _mm512_store_si512(&k_rows[kk][64 * c + 32], w1);
      }
    }
    const int blocks = (n + 15) / 16;
    // The rows past n of the last block: zeros (their scores are not read).
    std::memset(k_rows[n], 0, sizeof(k_rows[0]) * (16 * blocks - n));
    const auto* q_pairs = reinterpret_cast<const uint8_t*>(q);
    for (int blk = 0; blk < blocks; ++blk) {
      _tile_zero(0);
      for (int s = 0; s < kSlices; ++s) {
        _tile_loadd(4, &k_rows[16 * blk][32 * s], kD * 2);
        _tile_loadd(6, q_pairs + s * 64 * kG, 4 * kG);
        _tile_dpbf16ps(0, 4, 6);
      }
      _tile_stored(0, s_t[16 * blk], 4 * kG);
    }
    for (int g = 0; g < kG; ++g) {
      for (int kk = 0; kk < n; ++kk) scores[g * kTile + kk] = s_t[kk][g];
    }
  }

  static void pv(const float* p, int, const std::byte* const* rows, int n, int, int64_t, float* o,
                 int o_row, decode_detail::TilePrefetcher* prefetch) {
    using decode_detail::kTile;
    static_assert(kTile == 32);
    alignas(64) static constexpr uint8_t kZeroRow[kD] = {};
    // P as bf16, the keys past n zero (the scores buffer holds an earlier tile's there).
    alignas(64) uint16_t p_rows[kG][kTile];
    const __mmask16 lo = n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
    const __mmask16 hi = n >= 32   ? 0xFFFF
                         : n <= 16 ? 0
                                   : static_cast<__mmask16>((1u << (n - 16)) - 1);
    for (int g = 0; g < kG; ++g) {
      const float* pg = p + g * kTile;
      const __m512bh b =
          _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, pg + 16), _mm512_maskz_loadu_ps(lo, pg));
      _mm512_store_si512(p_rows[g], (__m512i)b);
    }
    // V pairs by 16-dim block (c, r) of the accumulator order: row t = keys 2t, 2t + 1.
    alignas(64) uint32_t v_pairs[4 * kChunks][16][16];
    const Loader load;
    const int pairs = (n + 1) / 2;
    for (int t = 0; t < pairs; ++t) {
      prefetch->tick();
      prefetch->tick();
      const auto* r0 = reinterpret_cast<const uint8_t*>(rows[2 * t]);
      const auto* r1 = 2 * t + 1 < n ? reinterpret_cast<const uint8_t*>(rows[2 * t + 1]) : kZeroRow;
      for (int c = 0; c < kChunks; ++c) {
        __m512i v[4];
        load.pairs(r0 + c * Loader::kChunkBytes, r1 + c * Loader::kChunkBytes, v);
        for (int r = 0; r < 4; ++r) _mm512_store_si512(v_pairs[4 * c + r][t], v[r]);
      }
    }
    for (int blk = 0; blk < 4 * kChunks; ++blk) {
      for (int t = pairs; t < 16; ++t) _mm512_store_si512(v_pairs[blk][t], _mm512_setzero_si512());
    }
    _tile_loadd(5, p_rows, 64);
    for (int blk = 0; blk < 4 * kChunks; ++blk) {
      _tile_loadd(2, o + 16 * blk, o_row * 4);
      _tile_loadd(7, v_pairs[blk], 64);
      _tile_dpbf16ps(2, 5, 7);
      _tile_stored(2, o + 16 * blk, o_row * 4);
    }
  }

  static void finish_o(float* o, int rows, int o_row, int dvo) {
    _tile_release();
    Dot::finish_o(o, rows, o_row, dvo);
  }
};

template <DType kKV, int kD>
DecodeItemFn amx_pick_group(int group_padded) {
  using decode_detail::decode_task;
  using S = avx512::Simd;
  switch (group_padded) {
    case 1:
      return &decode_task<S, kKV, kD, kD, 1, AmxTiles<kKV, kD, 1>>;
    case 2:
      return &decode_task<S, kKV, kD, kD, 2, AmxTiles<kKV, kD, 2>>;
    case 4:
      return &decode_task<S, kKV, kD, kD, 4, AmxTiles<kKV, kD, 4>>;
    case 8:
      return &decode_task<S, kKV, kD, kD, 8, AmxTiles<kKV, kD, 8>>;
    case 16:
      return &decode_task<S, kKV, kD, kD, 16, AmxTiles<kKV, kD, 16>>;
    default:
      return nullptr;
  }
}

template <DType kKV>
DecodeItemFn amx_pick_dim(int d, int group_padded) {
  switch (d) {
    case 64:
      return amx_pick_group<kKV, 64>(group_padded);
    case 128:
      return amx_pick_group<kKV, 128>(group_padded);
    case 256:
      return amx_pick_group<kKV, 256>(group_padded);
    default:
      return nullptr;
  }
}

}  // namespace

DecodeItemFn KVATTN_AMX_ENTRY(find_decode_kernel_fp8_amx)(DType kv, int dqk, int dvo,
                                                          int group_padded) {
  if (dqk != dvo) return nullptr;
  if (kv == DType::kE4M3) return amx_pick_dim<DType::kE4M3>(dqk, group_padded);
  if (kv == DType::kE5M2) return amx_pick_dim<DType::kE5M2>(dqk, group_padded);
  return nullptr;
}

}  // namespace kvattn::cpu
