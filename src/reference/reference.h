// The reference implementation (fp64 math, exact, slow): the definition every other backend is
// tested against. These functions assume validated arguments; the backend wraps them.
#pragma once

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::ref {

// Any of the five attention operations of DESIGN.md §2, writing args.out (and args.lse when
// given, in args.scalars.lse_base). Reads q/k/v of any dtype through their strided views.
Status attention(const Problem& problem, const AttentionArgs& args);

// llama RoPE on one head vector x[0, dim) at position `pos`: pair t in [0, dim/2) is rotated by
// (pos / rope_scale) * rope_theta^(-2t/dim); the pair is (x[t], x[t + dim/2]), or (x[2t], x[2t+1])
// when interleaved.
void rope_rotate(double* x, int dim, double pos, double rope_theta, double rope_scale,
                 bool interleave);

Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                   const TensorView& s_b, const TensorView& v_out, const TensorView& s_out);
Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                    const TensorView& s_out);
Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& cache);
Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                  const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope);

}  // namespace kvattn::ref
