// The cpu backend's one split-KV merge (decode and MLA): the partial states of one query row,
// each a normalized output o_k [dim] and its natural-log LSE, folded into the state over all of
// their keys through core/attention_math.h's StateMerger, the same fold fa2's merge runs.
// The sink (DESIGN.md §2), when given, joins once here as one more state with no value (the
// partials exclude it). NaN policy: a NaN LSE or a NaN in a weighted o_k makes the row NaN; a
// row that no partial gave a key yields o = 0 and lse = -inf (or the sink's logit).
#pragma once

#include <algorithm>

#include "core/attention_math.h"

namespace kvattn::cpu {

// partial(k) returns the k-th state as {lse, o}; writes the merged o [dim], returns its LSE.
template <class Partial>
float merge_partial_states(int64_t count, int dim, Partial partial, const float* sink, float* o) {
  math::StateMerger merger;
  std::fill(o, o + dim, 0.0f);
  auto rescale = [&](float factor) {
    if (factor == 1.0f) return;
    for (int d = 0; d < dim; ++d) o[d] *= factor;
  };
  for (int64_t k = 0; k < count; ++k) {
    const auto [lse, o_k] = partial(k);
    float scale_acc = 1.0f, scale_k = 0.0f;
    merger.add(lse, &scale_acc, &scale_k);
    rescale(scale_acc);
    if (scale_k == 0.0f) continue;  // an empty partial (lse = -inf) adds nothing, even a NaN o
    for (int d = 0; d < dim; ++d) o[d] += scale_k * o_k[d];
  }
  if (sink != nullptr) {
    float scale_acc = 1.0f, scale_sink = 0.0f;
    merger.add(*sink, &scale_acc, &scale_sink);
    rescale(scale_acc);
  }
  rescale(merger.inv_sum());
  return merger.lse();
}

}  // namespace kvattn::cpu
