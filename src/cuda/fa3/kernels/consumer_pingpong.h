// The two consumer warpgroups' ping-pong over the tensor cores (FlashAttention-3's warp scheduler
// barriers, hopper/named_barrier.hpp and its mainloop): a consumer warpgroup issues its GEMMs (S =
// Q K^T and O += P V) only in its turn, and hands the turn to the other warpgroup as soon as they
// are issued (not done), so one warpgroup's softmax runs while the other's GEMMs do, and the two
// warpgroups' GEMMs never compete for the tensor cores at the same time: the GEMMs of the CTA
// alternate between the warpgroups, a turn each.
//
// A turn is one named-barrier handshake. Warpgroup w waits on its own barrier, scheduler(w), with
// bar.sync over 256 threads: its 128 and the other warpgroup's 128, which arrive there (bar.arrive,
// no wait) at the end of their turn. Warpgroup 1 arrives on scheduler(0) once before its first
// turn, so warpgroup 0 goes first; after that each turn's end is the other's start. (FA3 has
// warpgroup 0 arrive on its own barrier before it syncs there; here warpgroup 1 gives the first
// turn, so no thread arrives twice in one phase of a barrier: the emulator refuses that.)
//
// Counting (why it cannot deadlock): both warpgroups walk the same tiles and, in a tile, the same
// K/V blocks (tile_range: one range for the tile's 128 rows), and take exactly one turn per GEMM
// step whatever the data: a step whose GEMM is replaced by guarded_pv (a V block with an inf or
// NaN) still takes its turn, empty. So each warpgroup takes T turns over the
// launch: warpgroup 0's k-th sync is completed by warpgroup 1's start (k = 1) or the end of its
// turn k - 1, warpgroup 1's k-th by the end of warpgroup 0's turn k, and one arrive is left over
// at exit (the end of warpgroup 1's last turn, on scheduler(0)), which nobody waits for. With one
// consumer warpgroup (params.h's consumer_warpgroups: decode tiles of 64 rows) the second exits
// before its first turn, so the ping-pong is off: no barrier waits on a warpgroup that has left.
// tests/cuda/fa3/fa3_pingpong_test.cc checks the alternation on the replay's wgmma order (every
// replay asserts it: fa3_replay_ctas.h).
#pragma once

#include "core/hd.h"
#include "cuda/fa3/kernels/named_barriers.h"

namespace kvattn::fa3 {

struct PingPong {
  int wg;       // this consumer warpgroup: 0 or 1
  bool active;  // two consumer warpgroups compute (consumer_warpgroups == 2)

  // Once, before the first turn: warpgroup 1 gives warpgroup 0 the first turn.
  template <class Ops>
  KVATTN_HD void start(const Ops& ops) const {
    if (active && wg == 1) ops.named_barrier_arrive(bar::scheduler(0), bar::kSchedulerThreads);
  }
  // Waits until the other warpgroup has issued the GEMMs of its turn.
  template <class Ops>
  KVATTN_HD void begin_turn(const Ops& ops) const {
    if (active) ops.named_barrier_sync(bar::scheduler(wg), bar::kSchedulerThreads);
  }
  // This turn's GEMMs are issued: the other warpgroup's turn.
  template <class Ops>
  KVATTN_HD void end_turn(const Ops& ops) const {
    if (active) ops.named_barrier_arrive(bar::scheduler(1 - wg), bar::kSchedulerThreads);
  }
};

}  // namespace kvattn::fa3
