// Stage and phase bookkeeping of fa3's K/V shared-memory ring (kStages slots). Each slot has two
// mbarriers: `full` (the producer's load of the slot completed: TMA transaction bytes or
// cp.async arrivals) and `empty` (every consumer warpgroup finished reading the slot). An
// mbarrier's phase flips each time its expected arrivals are all in; a wait names the parity of
// the phase it waits to see completed (mbarrier.try_wait.parity). Both sides walk the slots in
// order and flip their parity each time they wrap around.
//
// The producer waits on `empty` starting at parity 1: on a freshly initialised barrier (phase 0
// in progress) "phase with parity 1 completed" holds at once, so the first pass over the ring
// does not wait, and from the second pass on it waits for the consumers' release of the previous
// use of that slot. Consumers wait on `full` starting at parity 0. tests/cuda/
// fa3_pipeline_test.cc replays this against an emulated mbarrier under random interleavings:
// no consumer reads a slot before its load completed, no load overwrites a slot still being read.
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

}  // namespace kvattn::fa3::pipe
