// Stage and phase bookkeeping of fa3's K and V shared-memory rings (kStages slots each). Each slot
// has two mbarriers: `full` (the producer's load of the slot completed: TMA transaction bytes or
// cp.async arrivals) and `empty` (every consumer warpgroup finished reading the slot). K and V
// have a ring each (issue 22: full_k / full_v / empty_k / empty_v), so K is released as soon as
// S = Q K^T is done and V once O += P V is, and the producer loads a block's K ahead of the
// previous block's V (kv_load below): in steady state the next block's loads are in flight while
// the consumers compute, instead of waiting for the release of a slot that held both. An
// mbarrier's phase flips each time its expected arrivals are all in; a wait names the parity of
// the phase it waits to see completed (mbarrier.try_wait.parity). Both sides walk the slots in
// order and flip their parity each time they wrap around.
//
// The producer waits on `empty` starting at parity 1: on a freshly initialised barrier (phase 0
// in progress) "phase with parity 1 completed" holds at once, so the first pass over the ring
// does not wait, and from the second pass on it waits for the consumers' release of the previous
// use of that slot. Consumers wait on `full` starting at parity 0.
// tests/cuda/fa3/fa3_pipeline_test.cc replays this against an emulated mbarrier under random interleavings:
// no consumer reads a slot before its load completed, no load overwrites a slot still being read;
// and with the producer as eager as the barriers let it be, every load a consumer waits for in
// iteration n + 1 was issued before that consumer released anything in iteration n (one block of
// lookahead), which the single K+V ring of before failed.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::fa3::pipe {

template <int Stages>
struct PipelineState {
  static_assert(Stages >= 2, "a ring of one slot cannot overlap a load with its use");
  int index = 0;
  uint32_t phase = 0;
  int count = 0;  // iterations so far (for a tile's loop bounds, not for the barriers)

  KVATTN_HD void advance() {
    ++count;
    if (++index == Stages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

// The producer's first state: slot 0, waiting on `empty` with parity 1 (passes on a fresh ring).
template <int Stages>
KVATTN_HD PipelineState<Stages> producer_start() {
  PipelineState<Stages> s;
  s.phase = 1u;
  return s;
}
// A consumer's first state: slot 0, waiting on `full` with parity 0.
template <int Stages>
KVATTN_HD PipelineState<Stages> consumer_start() {
  return PipelineState<Stages>{};
}

// The state of a ring's use number `count` (0-based) from a side's first state: what `count`
// advance() calls give. The K and V rings are used once per block each, so a block's K and V
// have the same count, and neither side keeps a state per ring (nor picks one at run time).
template <int Stages>
KVATTN_HD PipelineState<Stages> state_at(PipelineState<Stages> start, int count) {
  PipelineState<Stages> s = start;
  s.index = count % Stages;
  s.phase = start.phase ^ uint32_t((count / Stages) & 1);
  s.count = count;
  return s;
}

// The producer's j-th load (j in [0, 2 blocks)) of a tile's blocks [0, blocks): K or V of block
// `block`. k_ahead (the 16-bit kernels, whose consumers overlap S_n with O += P_{n-1} V_{n-1}):
// K(0), K(1), V(0), K(2), V(1), ..., K(b-1), V(b-2), V(b-1) -- K(n+1) before V(n), the order the
// consumers need them in (S_{n+1} is issued before PV_n). Otherwise (FP8, one block at a time:
// S_n, then P_n V_n): K(0), V(0), K(1), V(1), ... (there, V(n) behind K(n+1) would be issued only
// once the consumers released K(n - 1), inside iteration n - 1: less than an iteration ahead).
struct KvLoad {
  bool v;
  int block;
};
KVATTN_HD KvLoad kv_load(int j, int blocks, bool k_ahead) {
  if (!k_ahead) return KvLoad{j % 2 == 1, j / 2};
  if (j == 0) return KvLoad{false, 0};
  if (j % 2 == 1) {
    const int k = (j + 1) / 2;
    return k < blocks ? KvLoad{false, k} : KvLoad{true, blocks - 1};
  }
  return KvLoad{true, j / 2 - 1};
}

// A consumer warpgroup's Q tile (full_q / empty_q, cta_layout.h): a ring of one slot, used once
// per tile of the CTA. The Q warp's wait for its k-th tile (0-based) on `empty_q`, from parity 1
// as a ring's producer (the first passes on a fresh barrier), and the consumer's on `full_q`.
KVATTN_HD uint32_t q_producer_parity(int k) { return 1u ^ uint32_t(k & 1); }
KVATTN_HD uint32_t q_consumer_parity(int k) { return uint32_t(k & 1); }

}  // namespace kvattn::fa3::pipe
