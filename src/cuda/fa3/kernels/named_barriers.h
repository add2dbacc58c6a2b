// The named barriers of fa3's body (16 per CTA, ids 0..15), in one list so that no two uses share
// an id by accident.
#pragma once

#include "core/hd.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"

namespace kvattn::fa3 {

namespace bar {
// 0: sync_threads (__syncthreads), the whole CTA, once after the mbarriers' initialisation.
// Consumer warpgroup wg's own barrier, its 128 threads: around the wait for the Q tile (kept for
// ptxas: prefill_cta.h), the epilogue's staging through the Q tile, v_has_non_finite's bar.red.
KVATTN_HD constexpr int warpgroup(int wg) { return 1 + wg; }
// Consumer warpgroup wg's turn at the tensor cores (the ping-pong), 256 threads.
KVATTN_HD constexpr int scheduler(int wg) { return 3 + wg; }
inline constexpr int kSchedulerThreads = 2 * frag::kWarpgroupThreads;
}  // namespace bar

}  // namespace kvattn::fa3
