// The L2 eviction priority of fa3's global loads (PTX createpolicy + .L2::cache_hint). K and V
// are read again by every query tile of their head (and every head of a GQA group reads the same
// KV head), so they are kept (evict_last); a Q row is read once, by its tile, and would only push
// K/V out (evict_first). Loads the kernel does not hint (the byte gathers of rows not in 16-byte
// chunks) keep the normal priority. The replay counts every load by hint (fa3_emu_ops.h).
#pragma once

#include <cstdint>

namespace kvattn::fa3 {

enum class L2Hint : uint8_t { kNormal, kEvictFirst, kEvictLast };

}  // namespace kvattn::fa3
