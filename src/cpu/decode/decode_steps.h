// What a decode task's tile policy (FmaTiles, DotTiles, ...) offers for steps of several KV
// heads, and whether a decode takes them (decode_kernel.h's decode_task_by_steps takes them).
#pragma once

#include <type_traits>

#include "cpu/decode/decode.h"
#include "cpu/decode/decode_fma_tiles.h"

namespace kvattn::cpu::decode_detail {

// Heads a policy's step may take together: Tiles::kStepHeads where it has one (with qk_step,
// pv_step and step_ticks), else 1.
template <class Tiles>
constexpr int step_heads() {
  if constexpr (requires { Tiles::kStepHeads; }) {
    return Tiles::kStepHeads;
  } else {
    return 1;
  }
}

// Heads of a policy's step after its full steps, where that many remain (Tiles::kTailStepHeads
// where it has one, else 1: the rest one head a step).
template <class Tiles>
constexpr int tail_step_heads() {
  if constexpr (requires { Tiles::kTailStepHeads; }) {
    return Tiles::kTailStepHeads;
  } else {
    return 1;
  }
}

// Tiles, as a type that depends on a step's width hs: the step body (a generic lambda in hs, in
// decode_task_by_steps) calls qk_step and pv_step through it, so that those calls wait for hs.
// Clang checks a generic lambda's calls that do not depend on its own parameters when the
// enclosing template is instantiated, in a discarded `if constexpr (hs > 1)` branch too, and
// Tiles without steps has neither (GCC waits).
template <int hs, class Tiles>
struct StepTiles {
  using type = Tiles;
};

// Whether a policy takes per-token V scales in its weights as two bf16 (Tiles::kSplitWeights:
// pv<true>; pv_step's last argument).
template <class Tiles>
constexpr bool split_weights() {
  if constexpr (requires { Tiles::kSplitWeights; }) {
    return Tiles::kSplitWeights;
  } else {
    return false;
  }
}

// Whether one head a step keeps a block's query vectors of a policy with the query rows in the
// lanes in registers (Tiles::kLaneQueriesInRegisters where it has one): its steps are the CPU
// class's choice (p.lane_head_steps).
template <class Tiles>
constexpr bool lane_queries_in_registers() {
  if constexpr (requires { Tiles::kLaneQueriesInRegisters; }) {
    return Tiles::kLaneQueriesInRegisters;
  } else {
    return false;
  }
}

// Whether a decode of these parameters takes Tiles' steps of kStepHeads heads: where each token's
// K rows of the task's heads lie side by side (NHD; PV takes V's rows through the head stride,
// whatever their layout) and neither fused RoPE nor a custom mask is on (both take the one-head
// path); the fp32-FMA tiles' steps, and those of query-lane tiles whose queries one head a step
// keeps in registers, where the CPU class takes them (p.fma_head_steps, p.lane_head_steps).
template <class S, DType kKV, int kDqk, int kDvo, int kNG, class Tiles>
bool takes_head_steps(const DecodeParams& p) {
  if constexpr (step_heads<Tiles>() == 1) {
    return false;
  } else {
    constexpr bool kFmaTiles = std::is_same_v<Tiles, FmaTiles<S, kKV, kDqk, kDvo, kNG>>;
    const bool class_takes = kFmaTiles                            ? p.fma_head_steps
                             : lane_queries_in_registers<Tiles>() ? p.lane_head_steps
                                                                  : true;
    return class_takes && !p.rope && !p.mask && p.k_heads_adjacent();
  }
}

}  // namespace kvattn::cpu::decode_detail
