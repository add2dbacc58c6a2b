// The prefill kernel for bf16 queries over bf16 or fp8 K/V on AMX-BF16 tiles (Sapphire Rapids and
// later): the bf16 pair layout, packed softmax and tile loop of bf16_pairs.h (shared with the
// vdpbf16ps kernel), with both products on TDPBF16PS (16 x 16 x 32 multiply-adds per
// instruction, f32 accumulation):
//   S^T[16 keys x 16 rows] += K[16 keys x 32 dims] . Q^T pairs[16 dim pairs x 16 rows x 2]
//     (A: the tile's K rows, bf16, copied contiguous; B: the staged Q^T pairs, as they are),
//   O^T[16 dims x 16 rows] += V^T[16 dims x 32 keys] . P^T pairs[16 key pairs x 16 rows x 2]
//     (A: the V pairs transposed once per KV tile; B: the P pairs the softmax packs over S^T).
// O^T stays in the scratch (f32, rescaled by the softmax); its tiles are loaded and stored once
// per KV tile. Tiles of 16: the head dims are multiples of 32 (the kernel's rule), a tile's keys
// and key pairs are padded to 16 with zeros, its rows already are (kRowAlign).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/common/amx.h"
#include "cpu/common/bf16_split.h"
#include "cpu/common/simd_avx512.h"
#include "cpu/prefill/params.h"

namespace kvattn::cpu::prefill::amx {
namespace {

#include "cpu/prefill/avx512_vec.h"  // before the kernel body, which uses Vec
#include "cpu/prefill/kernel.h"
#include "cpu/prefill/bf16_pairs.h"

constexpr int round16(int n) { return (n + 15) / 16 * 16; }

// The V pairs of the tile live at the start of the V buffer ([kv_tile / 2][dvo] words), their
// transpose V^T right after it ([dvo][value_t_pitch] words: the A tiles of P V), its rows an odd
// number of 64-byte lines apart (as row_pitch, tile_config.h: a tile load's 16 rows then spread
// over the L1 sets; scratch_layout leaves the V buffer the room).
inline int value_t_pitch(const PrefillParams& p) { return (p.tile.kv_tile / 32 | 1) * 16; }
inline uint32_t* value_pairs_t(const PrefillParams& p, float* scratch) {
  return reinterpret_cast<uint32_t*>(scratch + p.scratch.vf) +
         int64_t{p.tile.kv_tile / 2} * p.head_dim_vo;
}

// dst[c][r] = src[r][c] for a 16 x 16 block of 32-bit words (rows of src `src_stride` words
// apart, of dst `dst_stride`).
inline void transpose16x16(const uint32_t* src, int64_t src_stride, uint32_t* dst,
                           int64_t dst_stride) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * src_stride);
  ::kvattn::cpu::avx512::transpose16(r);
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * dst_stride, r[i]);
}

// Where the A rows of one block of 16 start and how many bytes apart they are.
struct RowBlock {
  const char* rows = nullptr;
  int64_t stride = 0;
};

// C[KB x RB blocks of 16 x 16] = A (KB row blocks) times B (RB blocks of 16 column words,
// `b_stride` bytes between pair rows) over `steps` steps of 32 bf16 (A advances 64 bytes, B
// `b_step` bytes a step): the accumulators zeroed (`load_c` false) or loaded from `c`, then
// stored to `c` (`c_stride` bytes between rows, block (i, j) at c + i * c_block + 16 * j).
template <int KB, int RB>
inline void tile_block(const RowBlock* a, const char* b, int64_t b_stride, int64_t b_step,
                       int steps, float* c, int64_t c_stride, int64_t c_block, bool load_c,
                       NextTilePrefetch& pf) {
  static_assert(KB >= 1 && KB <= 2 && RB >= 1 && RB <= 2);
  float* c01 = c + 16;
  float* c10 = c + c_block;
  float* c11 = c10 + 16;
  if (load_c) {
    _tile_loadd(0, c, c_stride);
    if constexpr (RB > 1) _tile_loadd(1, c01, c_stride);
    if constexpr (KB > 1) _tile_loadd(2, c10, c_stride);
    if constexpr (KB > 1 && RB > 1) _tile_loadd(3, c11, c_stride);
  } else {
    _tile_zero(0);
    if constexpr (RB > 1) _tile_zero(1);
    if constexpr (KB > 1) _tile_zero(2);
    if constexpr (KB > 1 && RB > 1) _tile_zero(3);
  }
  for (int s = 0; s < steps; ++s) {
    pf.step();
    _tile_loadd(4, a[0].rows + 64 * s, a[0].stride);
    _tile_loadd(6, b + s * b_step, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (RB > 1) {
      _tile_loadd(7, b + s * b_step + 64, b_stride);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (KB > 1) {
      _tile_loadd(5, a[1].rows + 64 * s, a[1].stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (RB > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, c_stride);
  if constexpr (RB > 1) _tile_stored(1, c01, c_stride);
  if constexpr (KB > 1) _tile_stored(2, c10, c_stride);
  if constexpr (KB > 1 && RB > 1) _tile_stored(3, c11, c_stride);
}

// Which operand the outer loop of tile_product holds while the inner one walks the other's blocks.
enum class Outer { kA, kB };

// C = A . B over blocks of 2 x 2 tiles: the `a_blocks` A row blocks, `b_blocks` B column blocks
// of 16 words (B: `b_stride` bytes between pair rows, `b_step` bytes a step); C `c_stride_floats`
// floats between rows. The outer loop holds a pair of A (kA) or B (kB) blocks in L1 while the
// inner one reads every block of the other operand.
template <Outer kOuter>
inline void tile_product(const RowBlock* a, int a_blocks, const void* b, int64_t b_stride,
                         int64_t b_step, int b_blocks, int steps, float* c, int64_t c_stride_floats,
                         bool load_c, NextTilePrefetch& pf) {
  const int64_t c_block = 16 * c_stride_floats, c_stride = c_stride_floats * 4;
  auto block = [&](int i, int j) {
    const bool two_a = i + 1 < a_blocks;
    const char* bj = static_cast<const char*>(b) + j * 64;
    float* cij = c + i * c_block + 16 * j;
    if (two_a && j + 1 < b_blocks) {
      tile_block<2, 2>(a + i, bj, b_stride, b_step, steps, cij, c_stride, c_block, load_c, pf);
    } else if (two_a) {
      tile_block<2, 1>(a + i, bj, b_stride, b_step, steps, cij, c_stride, c_block, load_c, pf);
    } else if (j + 1 < b_blocks) {
      tile_block<1, 2>(a + i, bj, b_stride, b_step, steps, cij, c_stride, c_block, load_c, pf);
    } else {
      tile_block<1, 1>(a + i, bj, b_stride, b_step, steps, cij, c_stride, c_block, load_c, pf);
    }
  };
  if constexpr (kOuter == Outer::kA) {
    for (int i = 0; i < a_blocks; i += 2) {
      for (int j = 0; j < b_blocks; j += 2) block(i, j);
    }
  } else {
    for (int j = 0; j < b_blocks; j += 2) {
      for (int i = 0; i < a_blocks; i += 2) block(i, j);
    }
  }
}

// A bf16 row of `dim` values (a multiple of 32) copied by 64-byte vectors.
inline void copy_row(const uint16_t* src, int dim, uint16_t* dst) {
  for (int d = 0; d < dim; d += 32) {
    _mm512_storeu_si512(dst + d, _mm512_loadu_si512(src + d));
  }
}

struct AmxProducts {
  static constexpr int kMaxBlocks = kMaxKVTile / 16;
  static constexpr int kMaxValueBlocks = 1024 / 16;  // head dims up to 1024 (validate_problem)
  RowBlock k_blocks[kMaxBlocks];

  // The prefetch steps of the products: a tile block a step.
  int steps(const PrefillParams& p, const TileRows& t, int keys) const {
    const int row_pairs = (t.row_vecs + 1) / 2;
    return row_pairs * ((round16(keys) / 16 + 1) / 2 * (p.head_dim_qk / 32) +
                        (p.head_dim_vo / 16 + 1) / 2 * (round16((keys + 1) / 2) / 16));
  }

  // K: every row copied (bf16) or widened (fp8) into the K tile buffer [round16(keys)][dqk], rows
  // past `keys` zero. Read where it lies, a block's 16 rows are a cache row apart (page slots
  // hold every KV head: 2 KiB at 8 heads x d128, 4 KiB at d256), so they share 2 (or 1) of the 64
  // L1 sets and the tile loads miss L1 over and over; contiguous at a row of 128-512 bytes they
  // spread over the sets, and the whole tile (32 KiB at d128) stays in L1 while the score
  // product walks it once per pair of row blocks. V: the pairs, padded with zero pairs to 16
  // (transposed in values()).
  void stage(const PrefillParams& p, const RequestInfo& req, int kv_head, int64_t j0, int keys,
             float* scratch) {
    auto* k_copy = reinterpret_cast<uint16_t*>(scratch + p.scratch.kf);
    float* tmp = scratch + p.scratch.row_tmp;
    const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
    KeyCursor key(p, req, j0);
    for (int jj = 0; jj < keys; ++jj, key.next()) {
      uint16_t* dst = k_copy + int64_t{jj} * dqk;
      const uint16_t* row = bf16_row(p, key.row(p.k, kv_head), dqk, tmp, dst);
      if (row != dst) copy_row(row, dqk, dst);
    }
    const int keys_pad = round16(keys);
    std::memset(k_copy + int64_t{keys} * dqk, 0, sizeof(uint16_t) * (keys_pad - keys) * dqk);
    for (int b = 0; b < keys_pad / 16; ++b) {
      k_blocks[b] = {reinterpret_cast<const char*>(k_copy + int64_t{16 * b} * dqk),
                     int64_t{dqk} * 2};
    }
    stage_value_pairs(p, req, kv_head, j0, keys, scratch);
    auto* vp = reinterpret_cast<uint32_t*>(scratch + p.scratch.vf);
    const int pairs = (keys + 1) / 2;
    std::memset(vp + int64_t{pairs} * dvo, 0, sizeof(uint32_t) * (round16(pairs) - pairs) * dvo);
  }

  // Whole tiles of 16 x 16: the products do not stop at a block's visible keys (VisibleKeys).
  void scores(const PrefillParams& p, const TileRows& t, int keys, float* scratch,
              const VisibleKeys&, NextTilePrefetch& pf) {
    // B outer where the K tile fits L1 beside a pair of row blocks' Q^T (up to 32 KiB: d128 and
    // below): both stay there, and Q^T streams from L2 once per KV tile instead of once per
    // pair of K blocks. A larger K tile (64 KiB at d256) would stream from L2 once per pair of
    // row blocks instead: there A outer (a pair of K blocks held, Q^T streamed) measured 2 %
    // faster (7 alternations, bench d256: 215.1 vs 220.0 ms).
    const int key_blocks = round16(keys) / 16;
    const bool k_tile_in_l1 = int64_t{16 * key_blocks} * p.head_dim_qk * 2 <= 32 * 1024;
    const int64_t b_stride = t.rows_pad * 4, b_step = 16 * t.rows_pad * 4;
    float* st = scratch + p.scratch.st;
    if (k_tile_in_l1) {
      tile_product<Outer::kB>(k_blocks, key_blocks, scratch + p.scratch.qt, b_stride, b_step,
                              t.row_vecs, p.head_dim_qk / 32, st, t.rows_pad, false, pf);
    } else {
      tile_product<Outer::kA>(k_blocks, key_blocks, scratch + p.scratch.qt, b_stride, b_step,
                              t.row_vecs, p.head_dim_qk / 32, st, t.rows_pad, false, pf);
    }
  }

  // The P pairs past the tile's keys are zeroed up to 16 (their S^T rows hold other keys'
  // scores), the V pairs (zero past the keys, after the numerics policy's guard) transposed.
  void values(const PrefillParams& p, const TileRows& t, int keys, float* scratch,
              const VisibleKeys&, NextTilePrefetch& pf) {
    const int dvo = p.head_dim_vo, pairs = (keys + 1) / 2, pairs_pad = round16(pairs);
    auto* pp = reinterpret_cast<uint32_t*>(scratch + p.scratch.st);
    std::memset(pp + pairs * t.rows_pad, 0, sizeof(uint32_t) * (pairs_pad - pairs) * t.rows_pad);
    const auto* vp = reinterpret_cast<const uint32_t*>(scratch + p.scratch.vf);
    uint32_t* vt = value_pairs_t(p, scratch);
    const int vt_stride = value_t_pitch(p);
    for (int p0 = 0; p0 < pairs_pad; p0 += 16) {
      for (int d0 = 0; d0 < dvo; d0 += 16) {
        transpose16x16(vp + int64_t{p0} * dvo + d0, dvo, vt + int64_t{d0} * vt_stride + p0,
                       vt_stride);
      }
    }
    RowBlock v_blocks[kMaxValueBlocks];
    for (int b = 0; b < dvo / 16; ++b) {
      v_blocks[b] = {reinterpret_cast<const char*>(vt + int64_t{16 * b} * vt_stride),
                     int64_t{vt_stride} * 4};
    }
    tile_product<Outer::kA>(v_blocks, dvo / 16, pp, t.rows_pad * 4, 16 * t.rows_pad * 4, t.row_vecs,
                            pairs_pad / 16, scratch + p.scratch.ot, t.rows_pad, true, pf);
  }
};

inline void run_item_amx(const PrefillParams& p, const WorkItem* items, int heads, float* scratch) {
  ::kvattn::cpu::amx::load_tile_config();
  run_task<&run_tile_pairs<AmxProducts>>(p, items, heads, scratch);
  _tile_release();
}

}  // namespace
}  // namespace kvattn::cpu::prefill::amx

namespace kvattn::cpu::prefill {
PrefillItemFn KVATTN_AMX_ENTRY(prefill_item_fn_amx)() { return &amx::run_item_amx; }
}  // namespace kvattn::cpu::prefill
