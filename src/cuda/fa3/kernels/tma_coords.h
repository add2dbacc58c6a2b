// TMA's tensor coordinates are signed 32-bit (cp.async.bulk.tensor: .s32 coordinates): fa3's map
// over dense or ragged K/V [tokens, H_kv, D] addresses a box by its first token, kv_first + n *
// kBlockN < tokens. A tensor of more than 2^31 - 1 tokens is not given to TMA; its keys are
// copied by the producer's cp.async path (64-bit row offsets), so no coordinate ever wraps.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::fa3 {

inline constexpr int64_t kMaxTmaCoordinate = INT32_MAX;

// Whether every box start of a K/V map over `tokens` rows fits TMA's coordinates.
KVATTN_HD constexpr bool tma_token_coordinates_fit(int64_t tokens) {
  return tokens > 0 && tokens <= kMaxTmaCoordinate;
}

}  // namespace kvattn::fa3
