// apply_rope of the cpu backend (the reference's fp64 angles and rotation, core/rope_host.h).
#include <vector>

#include "core/rope_host.h"
#include "cpu/ops/ops.h"
#include "cpu/ops/row_io.h"

namespace kvattn::cpu {

using namespace ops;

Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                  const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                  int num_threads) {
  const TensorView& any = q.empty() ? k : q;
  const int64_t rows = any.shape[0];
  const int dim = static_cast<int>(any.shape[2]);
  const int rotary_dim = rope_rotary_dim(rope, dim);
  for_rows(num_threads, rows, [&](int64_t n) {
    thread_local std::vector<double> cos_t, sin_t, x;
    cos_t.resize(rotary_dim / 2);
    sin_t.resize(rotary_dim / 2);
    x.resize(dim);
    // The angles come from the same fp64 code as the reference's, so the results agree bit for
    // bit.
    rope_cos_sin(load_i32(pos_ids, n), rotary_dim, rope, cos_t.data(), sin_t.data());
    auto rotate = [&](const TensorView& in, const TensorView& out) {
      if (in.empty() || out.empty()) return;
      for (int64_t h = 0; h < in.shape[1]; ++h) {
        // The whole head vector is read before it is written: out may be in itself.
        for (int d = 0; d < dim; ++d) x[d] = load(in, at(in, n, h, d));
        rope_rotate_pairs(x.data(), rotary_dim, rope.interleave, cos_t.data(), sin_t.data());
        for (int d = 0; d < dim; ++d) store(out, at(out, n, h, d), x[d]);
      }
    };
    rotate(q, q_out);
    rotate(k, k_out);
  });
  return Status::Ok();
}

}  // namespace kvattn::cpu
