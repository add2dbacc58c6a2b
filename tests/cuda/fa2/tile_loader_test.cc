// fa2's tile loader's row addressing (src/cuda/fa2/kernels/tile_loader.h), on the CPU.
#include "cuda/fa2/kernels/tile_loader.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace kvattn::fa2 {
namespace {

// Loads only from the page table [begin, end); any other address fails the test (a wrong page
// index reads far outside it) and reads as 0.
struct PageTableOps {
  const int32_t* begin;
  const int32_t* end;
  int32_t ldg(const int32_t* p) const {
    if (p < begin || p >= end) {
      ADD_FAILURE() << "page-table read outside the table, entry " << (p - begin);
      return 0;
    }
    return *p;
  }
};

// kv_row_offset's page division: FastDiv's below 2^32, a 64-bit division past it; both exact:
// page kv_indices[kv_first + j / page_size], slot j % page_size. (kv_first is set so that the
// page-table entry read is always the second: the keys are of requests of more than 2^32 keys.)
// Truncating the key to 32 bits, as before, put keys past 2^32 - 1 in the wrong page and slot.
TEST(Fa2TileLoader, KvRowOffsetOfKeysPast32Bits) {
  const int32_t pages[] = {3, 5, 9};
  const paged::CacheStrides strides{1000, 10, 1, 1};
  AttentionParams p;
  p.paged = true;
  p.kv_indices = pages;
  for (int page_size : {1, 7, 16, 1000}) {
    p.page_size = page_size;
    p.page_div = cuda::FastDiv(uint32_t(page_size));
    for (int64_t key : {int64_t(0), int64_t(UINT32_MAX) - 1, int64_t(UINT32_MAX),
                        int64_t(UINT32_MAX) + 1, int64_t(UINT32_MAX) + 12345, int64_t(1) << 40}) {
      RequestInfo r;
      r.kv_first = 1 - key / page_size;
      EXPECT_EQ(kv_row_offset(PageTableOps{pages, pages + 3}, p, strides, r, key, 1),
                5 * 1000 + (key % page_size) * 10 + 1)
          << key << " / " << page_size;
    }
  }
  p.paged = false;  // ragged: the row kv_first + j, no division
  RequestInfo r;
  r.kv_first = 7;
  EXPECT_EQ(kv_row_offset(PageTableOps{pages, pages + 3}, p, strides, r, int64_t(1) << 33, 2),
            (7 + (int64_t(1) << 33)) * 10 + 2);
}

}  // namespace
}  // namespace kvattn::fa2
