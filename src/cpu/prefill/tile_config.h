// Prefill tile sizes and the per-thread scratch layout: the one place both the planner (work
// items, workspace size) and the kernels (buffer offsets) read them from.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/common/workspace.h"

namespace kvattn::cpu::prefill {

// Query rows of a tile are padded to a multiple of this (the widest vector, 16 f32 lanes), so the
// scratch layout does not depend on the ISA level that runs it.
inline constexpr int kRowAlign = 16;
// A tile stacks all query heads of a GQA group as rows (token-major: row = token * group + head),
// so each converted K/V tile serves the whole group.
inline constexpr int kTargetTileRows = 128;

// The KV heads one prefill task takes at most (run_task and run_tile, kernel.h;
// prefill_task_heads, prefill.cc).
inline constexpr int kPrefillMaxTaskHeads = 8;

// The largest KV tile prefill_tile hands out (kernels size stack arrays of row pointers by it).
inline constexpr int kMaxKVTile = 128;

// The pitch of the per-row buffers (Q^T, S^T, O^T: one row of floats per dim or key), rows
// rounded up to kRowAlign and then to an odd number of 64-byte lines: at an even number (a
// multiple of 128 bytes, e.g. 256 rows = 1 KiB) the 16 rows a vector or tile load walks down a
// column fall into a few L1 sets and evict each other (measured on the AMX kernel: 256 rows
// took 11-13 % longer than 240 at d 128 and d 256). The rows past `rows` are zeros or ignored.
// Also the pitch of the staged f32 K/V rows (row_pitch(head dim)) where a kernel asks for it
// (TilePolicy): the f32 value kernel walks a V column down the keys, and at an even number of
// lines (d 64, 128, 256: 4, 8, 16) 64 keys' rows fall into a few L1 sets (512 bytes: 8 of 64).
constexpr int row_pitch(int rows) {
  const int lines = (rows + kRowAlign - 1) / kRowAlign;
  return (lines % 2 == 0 ? lines + 1 : lines) * kRowAlign;
}

struct PrefillTile {
  int tokens;    // query tokens per tile
  int rows;      // tokens * group
  int rows_pad;  // the row pitch (row_pitch(rows))
  int kv_tile;   // keys per KV tile
  bool odd_staged_pitch = false;  // staged f32 K/V rows row_pitch(d) apart (else d: dense)
};

// A kernel's tile policy (its kernel table entry, the rNkM of its name): query rows a tile aims
// at, keys a KV tile (0: 64, or 32 for head dims above 256 in all), and whether the staged f32
// K/V rows take an odd number of lines: the AVX2 kernel's do (AMD Zen 4 running it, in-process
// A/Bs of 7-15 rounds, odd / dense wall medians: prefill d 128 0.89-0.99, d 256 0.89-0.98, d 64
// 0.97-0.98); the AVX-512 FMA kernel's stay dense (there 0.98-1.01: no gain).
struct TilePolicy {
  int target_rows = kTargetTileRows;
  int kv_tile = 0;
  bool odd_staged_pitch = false;
};

// The default policy, 128 rows x 64 keys: each K/V tile, converted or packed once, serves 128
// rows (against 64 rows this measured 280 vs 258 GFLOP/s per core on the bf16 path at d 128). The
// register blocks walk 64 rows at a time, so the Q^T columns they stream (32 KiB at d 128) stay in
// L1; the K/V tiles, S and O^T (about 200 KiB) stay in L2. Wider heads halve the KV tile to keep
// it so. The AMX kernel takes 256 x 128 (its products stream tiles from L2, and its per-KV-tile
// staging is shared by twice the rows).
constexpr PrefillTile prefill_tile(int group, int head_dim_qk, int head_dim_vo,
                                   TilePolicy policy = {}) {
  PrefillTile t{};
  t.tokens = group >= policy.target_rows ? 1 : policy.target_rows / group;
  t.rows = t.tokens * group;
  t.rows_pad = row_pitch(t.rows);
  t.kv_tile = policy.kv_tile != 0 ? policy.kv_tile : head_dim_qk + head_dim_vo > 256 ? 32 : 64;
  t.odd_staged_pitch = policy.odd_staged_pitch;
  return t;
}

// Offsets (in floats, each a multiple of 16 so every buffer is 64-byte aligned) of one thread's
// scratch.
struct ScratchLayout {
  int64_t qt = 0;                    // Q^T [D_qk][rows_pad], scaled (and rotated)
  int64_t st = 0;                    // S^T then P^T [kv_tile][rows_pad]
  int64_t ot = 0;                    // O^T [D_vo][rows_pad], unnormalized
  int64_t kf = 0;                    // K tile f32 [kv_tile][k_pitch]
  int64_t vf = 0;                    // V tile f32 [kv_tile][v_pitch] (+ 32 rows)
  int k_pitch = 0, v_pitch = 0;      // floats between staged K / V rows (D_qk / D_vo, or
                                     // row_pitch of them)
  int64_t row_max = 0, row_sum = 0;  // [rows_pad], log2 domain
  int64_t row_pos = 0;               // [rows_pad] absolute query positions (int32 storage)
  int64_t row_slope = 0;             // [rows_pad] ALiBi slope * log2(e)
  int64_t row_tmp = 0;               // [kRowAlign x max(D_qk, D_vo) + 64] conversion staging:
                                     // kRowAlign query or output rows at once (kernel.h's
                                     // stage_queries, store_tile)
  int64_t pair_rows = 0;             // 3 x max(D_qk, D_vo) u16: bf16 rows being paired
  int64_t p_lo = 0;                  // [kv_tile / 2][rows_pad] u32: the bf16 kernel's P pairs'
                                     // low parts (per-token V scales: softmax_pack)
  // A task of several KV heads (run_task, kernel.h) keeps each head's own Q^T, O^T and row
  // vectors (max, sum, position, slope): head 0 in the buffers above, head h >= 1 in slot h - 1
  // of `head_slot` floats after them (for_head); the other buffers serve one head at a time.
  int64_t head_slot = 0;
  int64_t qt_floats = 0, ot_floats = 0, row_floats = 0;  // one head's Q^T, O^T, row vector
  int64_t slots = 0;                                     // where slot 0 starts
  int64_t floats = 0;                                    // total per thread

  // The layout head h of a task reads: its own Q^T, O^T and row vectors, the shared rest.
  constexpr ScratchLayout for_head(int h) const {
    ScratchLayout s = *this;
    if (h == 0) return s;
    const int64_t at = slots + (h - 1) * head_slot;
    s.qt = at;
    s.ot = s.qt + qt_floats;
    s.row_max = s.ot + ot_floats;
    s.row_sum = s.row_max + row_floats;
    s.row_pos = s.row_sum + row_floats;
    s.row_slope = s.row_pos + row_floats;
    return s;
  }
};

// `task_heads`: the KV heads a task may take (ScratchLayout::for_head), a slot each past the
// first.
constexpr ScratchLayout scratch_layout(const PrefillTile& t, int head_dim_qk, int head_dim_vo,
                                       int task_heads = 1) {
  ScratchLayout s{};
  WorkspaceLayout at;
  auto take = [&at](int64_t n) {
    return static_cast<int64_t>(at.take(sizeof(float) * n) / sizeof(float));
  };
  s.qt = take(int64_t{head_dim_qk} * t.rows_pad);
  s.st = take(int64_t{t.kv_tile} * t.rows_pad);
  s.ot = take(int64_t{head_dim_vo} * t.rows_pad);
  s.k_pitch = t.odd_staged_pitch ? row_pitch(head_dim_qk) : head_dim_qk;
  s.v_pitch = t.odd_staged_pitch ? row_pitch(head_dim_vo) : head_dim_vo;
  s.kf = take(int64_t{t.kv_tile} * s.k_pitch);
  s.vf = take(int64_t{t.kv_tile + 32} * s.v_pitch);  // + the AMX kernel's V^T padding
  s.row_max = take(t.rows_pad);
  s.row_sum = take(t.rows_pad);
  s.row_pos = take(t.rows_pad);
  s.row_slope = take(t.rows_pad);
  const int64_t widest = head_dim_qk > head_dim_vo ? head_dim_qk : head_dim_vo;
  s.row_tmp = take(kRowAlign * widest + 64);
  s.pair_rows = take((3 * widest + 1) / 2);
  s.p_lo = take(int64_t{(t.kv_tile + 1) / 2} * t.rows_pad);
  // Each a multiple of 16 floats (rows_pad is), so every slot's buffers stay 64-byte aligned.
  s.qt_floats = int64_t{head_dim_qk} * t.rows_pad;
  s.ot_floats = int64_t{head_dim_vo} * t.rows_pad;
  s.row_floats = t.rows_pad;
  s.head_slot = s.qt_floats + s.ot_floats + 4 * s.row_floats;
  s.slots = take(s.head_slot * (task_heads - 1));
  s.floats = static_cast<int64_t>(at.size() / sizeof(float));
  return s;
}

}  // namespace kvattn::cpu::prefill
