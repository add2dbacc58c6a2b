// merge_state(s) of the cpu backend (the reference's semantics, fp64 arithmetic: see row_io.h).
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/ops/ops.h"
#include "cpu/ops/row_io.h"

namespace kvattn::cpu {
namespace {

using namespace ops;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Merges `count` states of one row (see the reference's merge_row): -inf states are skipped,
// a NaN LSE poisons the row, no state left gives o = 0 and lse = -inf.
template <class Lse, class Value, class Write>
double merge_row(int64_t count, int64_t dim, Lse lse, Value value, Write write,
                 std::vector<double>& weight) {
  double max_lse = kNegInf;
  for (int64_t k = 0; k < count; ++k) {
    const double s = lse(k);
    if (std::isnan(s)) {
      for (int64_t d = 0; d < dim; ++d) write(d, s);
      return s;
    }
    if (s > max_lse) max_lse = s;
  }
  if (max_lse == kNegInf) {
    for (int64_t d = 0; d < dim; ++d) write(d, 0.0);
    return kNegInf;
  }
  weight.assign(count, 0.0);
  double sum = 0.0;
  for (int64_t k = 0; k < count; ++k) {
    const double s = lse(k);
    if (s == kNegInf) continue;
    weight[k] = std::exp(s - max_lse);
    sum += weight[k];
  }
  for (int64_t d = 0; d < dim; ++d) {
    double o = 0.0;
    for (int64_t k = 0; k < count; ++k) {
      if (weight[k] != 0.0) o += weight[k] * value(k, d);
    }
    write(d, o / sum);
  }
  return max_lse + std::log(sum);
}

}  // namespace

Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                   const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                   int num_threads) {
  const int64_t rows = v_a.shape[0], heads = v_a.shape[1], dim = v_a.shape[2];
  for_rows(num_threads, rows * heads, [&](int64_t row) {
    const int64_t n = row / heads, h = row % heads;
    thread_local std::vector<double> weight;
    const double lse = merge_row(
        2, dim, [&](int64_t k) { return load(k == 0 ? s_a : s_b, at(k == 0 ? s_a : s_b, n, h)); },
        [&](int64_t k, int64_t d) {
          const TensorView& v = k == 0 ? v_a : v_b;
          return load(v, at(v, n, h, d));
        },
        [&](int64_t d, double o) { store(v_out, at(v_out, n, h, d), o); }, weight);
    if (!s_out.empty()) store(s_out, at(s_out, n, h), lse);
  });
  return Status::Ok();
}

Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                    const TensorView& s_out, int num_threads) {
  const int64_t rows = v.shape[0], states = v.shape[1], heads = v.shape[2], dim = v.shape[3];
  for_rows(num_threads, rows * heads, [&](int64_t row) {
    const int64_t n = row / heads, h = row % heads;
    thread_local std::vector<double> weight;
    const double lse = merge_row(
        states, dim, [&](int64_t k) { return load(s, at(s, n, k, h)); },
        [&](int64_t k, int64_t d) { return load(v, at(v, n, k, h, d)); },
        [&](int64_t d, double o) { store(v_out, at(v_out, n, h, d), o); }, weight);
    if (!s_out.empty()) store(s_out, at(s_out, n, h), lse);
  });
  return Status::Ok();
}

}  // namespace kvattn::cpu
