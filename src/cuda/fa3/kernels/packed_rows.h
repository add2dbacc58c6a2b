// The rows of an fa3 tile and the (query token, query head) each one stands for. Prefill: a tile
// holds the tokens of one query head (rows_per_token = 1). Decode: the query rows of a GQA group
// are packed into one tile (FA3's PackGQA), rows_per_token = group, so one K/V block loaded for
// KV head `tile.head` serves every query head that reads it, and a decode step of one token fills
// `group` of the tile's 64-row wgmma instead of 1. Row r of the packed rows is token
// r / rows_per_token at query head tile.head * rows_per_token + r % rows_per_token. Plain
// host/device code: the planner, the kernel and tests/cuda/fa3/fa3_split_kv_test.cc use the same
// functions (every (token, head) in exactly one row of one tile).
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::fa3::pack {

// Rows per query token: the GQA group when packed, else 1.
KVATTN_HD int rows_per_token(bool packed, int group) { return packed ? group : 1; }

// Heads the tiles are made for: query heads, or KV heads when packed.
KVATTN_HD int tile_heads(int num_qo_heads, int rows_per_token) {
  return num_qo_heads / rows_per_token;
}

// Rows of a request with qo_len query tokens.
KVATTN_HD int64_t packed_rows(int64_t qo_len, int rows_per_token) {
  return qo_len * rows_per_token;
}

// The most packed rows a request may have: packed rows are divided in 32 bits (a 64-bit division
// is a subroutine call on the GPU, whose register saves spill in the consumers); launch.cu
// refuses a request past it.
inline constexpr int64_t kMaxPackedRows = 0x7fffffff;

// Token of packed row `row` (0 <= row <= kMaxPackedRows).
KVATTN_HD int64_t token_of(int64_t row, int rows_per_token) {
  return int64_t(uint32_t(row) / uint32_t(rows_per_token));
}

struct TokenHead {
  int64_t token = 0;  // within the request
  int qo_head = 0;
};

KVATTN_HD TokenHead token_head(int64_t row, int tile_head, int rows_per_token) {
  const int64_t token = token_of(row, rows_per_token);
  return TokenHead{token, tile_head * rows_per_token + int(row - token * rows_per_token)};
}

// The KV head every row of a tile reads (a packed tile holds one GQA group; an unpacked one one
// query head of it).
KVATTN_HD int kv_head(int tile_head, int rows_per_token, int group) {
  return tile_head * rows_per_token / group;
}

}  // namespace kvattn::fa3::pack
