// One row of the split-KV merge (fa2's schedule and fa3's split plan alike): query row out_row's
// partial states [first_state, first_state + chunks), each [H_qo, D_vo] fp32 outputs and [H_qo]
// natural-log LSEs, merged by split_merge.h into row out_row of out and lse.
#pragma once

#include <cstdint>

namespace kvattn::cuda {

struct MergeRow {
  int64_t out_row = 0;
  int64_t first_state = 0;
  int64_t chunks = 1;
};

}  // namespace kvattn::cuda
