// fa3's CTA layout: the threads and their register split, the shared-memory plan of a key
// (SmemPlan) and the mbarriers of the K/V rings and Q tiles (Barriers), shared by the producer
// (producer.h) and the consumers (prefill_cta.h).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/tile_size.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"

namespace kvattn::fa3 {


// The K and V rings' depth (tile_size.h: the same for every key).
inline constexpr int kStages = tile_shape(128, 128, 2).stages;
inline constexpr int kThreads = 3 * frag::kWarpgroupThreads;
inline constexpr int kWarpsPerWarpgroup = frag::kWarpgroupThreads / 32;
// Register split between the producer and the consumers (setmaxnreg): 128 x 40 + 256 x 232 fits
// the 64 K registers of an SM with one CTA resident. (The producer's copy loops are not unrolled:
// more spills at 40 otherwise; for_each_chunk.)
inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;
// The registers per thread at launch (__launch_bounds__(kThreads, 1): ptxas gives 168).
inline constexpr int kLaunchRegs = 168;

// Rows are whole 128-byte panels (smem::padded_row_bytes): FP8 Q/K rows at head dims 64 and 192,
// and FP8 V^T rows of 64 keys (head dim 256), carry padding.
template <int EB, int QK, int VO>
struct SmemPlan {
  static constexpr TileShape kShape = tile_shape(QK, VO, EB);
  static_assert(kShape.stages == kStages && kShape.block_m == sched::kBlockM);
  static constexpr int BN = kShape.block_n;
  static constexpr uint32_t kQBytes =  // per warpgroup
      frag::kWarpgroupRows * smem::padded_row_bytes(QK * EB);
  static constexpr uint32_t kKBytes = BN * smem::padded_row_bytes(QK * EB);
  // 16-bit V [keys][dims]; FP8 V^T [dims][keys].
  static constexpr uint32_t kVBytes =
      EB == 2 ? BN * smem::padded_row_bytes(VO * EB) : VO * smem::padded_row_bytes(BN);
  // FP8 V by TMA: the block as it lies in memory, [keys][dims] in 128-byte panels as K's tile
  // (the TMA boxes'), staged for the producer's transpose into V^T (stage_v_transposed).
  static constexpr uint32_t kVStageBytes = EB == 1 ? BN * smem::padded_row_bytes(VO) : 0;
  static constexpr uint32_t q(int wg) { return uint32_t(wg) * kQBytes; }
  static constexpr uint32_t k(int stage) {
    return 2 * kQBytes + uint32_t(stage) * (kKBytes + kVBytes);
  }
  static constexpr uint32_t v(int stage) { return k(stage) + kKBytes; }
  static constexpr uint32_t v_stage(int stage) {
    return k(kStages) + uint32_t(stage) * kVStageBytes;
  }
  static constexpr uint32_t barriers() { return v_stage(kStages); }
  // + 1024: the dynamic shared memory base is rounded up to the swizzle's alignment.
  // full_q, empty_q: one per consumer warpgroup; full_k, full_v, empty_k, empty_v (and FP8's
  // full_vs, empty_vs): kStages mbarriers each (Barriers).
  static constexpr uint32_t total() {
    return barriers() + (4 + (EB == 1 ? 6 : 4) * kStages) * 8 + 1024;
  }
  static_assert(total() <= 227 * 1024, "a CTA's shared memory on SM90");
};

// The rings' mbarriers (pipeline_state.h): a K ring and a V ring of kStages slots, each slot with
// its `full` (the load landed) and `empty` (every consumer warp is done reading it).
// One base pointer (the producer runs at 40 registers): the arrays follow each other.
// Each consumer warpgroup's Q tile has its pair too, a ring of one slot: full_q (the Q warp's
// copies of the tile's rows landed) and empty_q (every warp of the warpgroup is done with the
// tile: its wgmmas read Q, its epilogue staged O there).
// FP8 V by TMA adds the staging ring's (SmemPlan::v_stage): full_vs (its box landed) and empty_vs
// (every producer thread has read it into registers), the producer's own.
struct Barriers {
  uint64_t* base;
  KVATTN_HD uint64_t* full_q(int wg) const { return base + wg; }
  KVATTN_HD uint64_t* empty_q(int wg) const { return base + 2 + wg; }
  KVATTN_HD uint64_t* full_k(int slot) const { return base + 4 + slot; }
  KVATTN_HD uint64_t* full_v(int slot) const { return base + 4 + kStages + slot; }
  KVATTN_HD uint64_t* empty_k(int slot) const { return base + 4 + 2 * kStages + slot; }
  KVATTN_HD uint64_t* empty_v(int slot) const { return base + 4 + 3 * kStages + slot; }
  KVATTN_HD uint64_t* full_vs(int slot) const { return base + 4 + 4 * kStages + slot; }
  KVATTN_HD uint64_t* empty_vs(int slot) const { return base + 4 + 5 * kStages + slot; }
};

}  // namespace kvattn::fa3
