// Split-KV planning, host and device: a request's keys are cut into chunks of a fixed size, each
// chunk writes a partial (o, lse) state, and a merge combines them. The chunking and the index of
// each partial state are computed here, once, for the planner and the kernels alike.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace kvattn::split {

// chunk_size <= 0 means no split. A request with no keys still has one (empty) chunk so that
// its queries get o = 0, lse = -inf.
KVATTN_HD int64_t num_chunks(int64_t kv_len, int64_t chunk_size) {
  if (chunk_size <= 0 || kv_len <= chunk_size) return 1;
  return (kv_len + chunk_size - 1) / chunk_size;
}

struct ChunkRange {
  int64_t begin;
  int64_t end;
};
KVATTN_HD ChunkRange chunk_range(int64_t kv_len, int64_t chunk_size, int64_t chunk) {
  if (num_chunks(kv_len, chunk_size) == 1) return ChunkRange{0, kv_len};
  int64_t begin = chunk * chunk_size;
  int64_t end = begin + chunk_size < kv_len ? begin + chunk_size : kv_len;
  return ChunkRange{begin, end};
}

// Partial states of a request with qo_len queries and C chunks are stored query-major: state of
// (query i, chunk c) is at base + i * C + c, where base is the sum of qo_len * C over the earlier
// split requests. Each state holds [H_qo, D_vo] outputs and [H_qo] lse.
struct PartialBlock {
  int64_t base = 0;
  int64_t chunks = 1;
  KVATTN_HD int64_t state(int64_t i, int64_t chunk) const { return base + i * chunks + chunk; }
};

// A chunk size that gives about `target_units` work units across the batch: chosen from the
// longest request so that decode of a few long requests still fills the GPU (or the cores), and
// never below `min_chunk` keys (a chunk too small costs more to merge than it saves). 0 = no
// split when the batch alone already gives enough units.
inline int64_t choose_chunk_size(const int64_t* kv_lens, int batch, int64_t units_per_request,
                                 int64_t target_units, int64_t min_chunk) {
  int64_t longest = 0;
  for (int b = 0; b < batch; ++b) longest = kv_lens[b] > longest ? kv_lens[b] : longest;
  int64_t units = int64_t(batch) * units_per_request;
  if (units >= target_units || longest <= min_chunk) return 0;
  int64_t splits = (target_units + units - 1) / units;
  int64_t chunk = (longest + splits - 1) / splits;
  if (chunk < min_chunk) chunk = min_chunk;
  return chunk >= longest ? 0 : chunk;
}

}  // namespace kvattn::split
