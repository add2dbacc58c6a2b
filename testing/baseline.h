// A plain low-precision attention, used only to size tolerances (STYLE.md: error(backend vs
// fp64) <= 2 x error(plain low-precision implementation vs fp64) + small atol, FA3's rule).
// It is what a straightforward kernel would compute: fp32 math, scores in fp32 (for an e4m3 or
// e5m2 query summed as the FP8 tensor core sums q . k, 32 dims per step in its reduced precision:
// testing/fp8_accumulation.h), the softmax probabilities P rounded to q's type when q is f16/bf16
// (as a 16-bit MMA consumes them) and to e4m3 when q is e4m3 or e5m2 (as the FP8 P.V MMA consumes
// them, FlashAttention-3's way), P·V accumulated in fp32, the output rounded to o_dtype. Same
// semantics as the reference otherwise.
#pragma once

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::testing {

// Writes args.out (and args.lse when given, in args.scalars.lse_base). `args` must be valid for
// `problem`.
Status baseline_attention(const Problem& problem, const AttentionArgs& args);

}  // namespace kvattn::testing
