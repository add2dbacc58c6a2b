// The split-KV merge of fa2 and fa3 (src/cuda/common/split_merge.h): its grid (merge_grid) and
// kernel body (merge_thread) walked on the host exactly as the GPU runs them. Every (merge row,
// query head) is covered exactly once (each output element and each LSE stored once, nothing
// else stored), over rows with unequal numbers of chunks (including none), head counts that are
// not a multiple of the vector width, head dims of one to many warps, and chunks that saw no key
// (lse = -inf); the merged values match an fp64 merge of the same partial states, with and
// without a sink.
#include "cuda/common/split_merge.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/numeric.h"

namespace kvattn::cuda {
namespace {

// Records every store the body makes, by (out row, head, dim) (dim -1: the LSE).
struct RecordingWriter {
  std::map<std::tuple<int64_t, int, int>, std::vector<float>>* stores;
  void out(const MergeParams&, int64_t out_row, int head, int d, float x) const {
    (*stores)[{out_row, head, d}].push_back(x);
  }
  void lse(const MergeParams&, int64_t out_row, int head, float x) const {
    (*stores)[{out_row, head, -1}].push_back(x);
  }
};

struct MergeCase {
  std::vector<MergeRow> rows;
  std::vector<float> partial_o, partial_lse, sinks;
  int heads = 0, dim = 0;
  int64_t out_rows = 0;
};

// Rows with chunk counts `chunks` (out rows spaced by one so that some out rows are not merged),
// states in row order, random partial outputs; about one chunk in four saw no key (lse = -inf).
MergeCase make_case(const std::vector<int64_t>& chunks, int heads, int dim, unsigned seed) {
  MergeCase c;
  c.heads = heads;
  c.dim = dim;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f), lse(-3.0f, 6.0f);
  int64_t state = 0;
  for (size_t r = 0; r < chunks.size(); ++r) {
    c.rows.push_back(MergeRow{int64_t(2 * r + 1), state, chunks[r]});
    state += chunks[r];
  }
  c.out_rows = int64_t(2 * chunks.size() + 1);
  c.partial_o.resize(size_t(state * heads * dim));
  c.partial_lse.resize(size_t(state * heads));
  for (float& x : c.partial_o) x = value(rng);
  for (float& x : c.partial_lse) x = rng() % 4 == 0 ? -INFINITY : lse(rng);
  for (int h = 0; h < heads; ++h) c.sinks.push_back(lse(rng));
  return c;
}

MergeParams params_for(const MergeCase& c, bool sinks) {
  MergeParams p;
  p.rows = c.rows.data();
  p.num_rows = int64_t(c.rows.size());
  p.partial_o = c.partial_o.data();
  p.partial_lse = c.partial_lse.data();
  p.num_heads = c.heads;
  p.head_dim = c.dim;
  p.sinks = sinks ? c.sinks.data() : nullptr;
  p.out_kind = OutKind::kF32;
  p.o_stride_head = c.dim;
  p.o_stride_row = int64_t(c.heads) * c.dim;
  p.lse_stride_head = 1;
  p.lse_stride_row = c.heads;
  p.lse_scale = 1.0f;
  return p;
}

// The merged (o, lse) of one (row, head) in fp64 from the partial states.
std::pair<std::vector<double>, double> merged(const MergeCase& c, const MergeRow& row, int h,
                                              bool sink) {
  double m = sink ? c.sinks[size_t(h)] : -INFINITY;
  for (int64_t k = 0; k < row.chunks; ++k)
    m = std::max(m, double(c.partial_lse[size_t((row.first_state + k) * c.heads + h)]));
  std::vector<double> o(size_t(c.dim), 0.0);
  if (m == -INFINITY) return {o, -INFINITY};
  double sum = sink ? std::exp(c.sinks[size_t(h)] - m) : 0.0;
  for (int64_t k = 0; k < row.chunks; ++k) {
    const int64_t s = (row.first_state + k) * c.heads + h;
    const double lse = c.partial_lse[size_t(s)];
    if (lse == -INFINITY) continue;
    const double w = std::exp(lse - m);
    sum += w;
    for (int d = 0; d < c.dim; ++d) o[size_t(d)] += w * c.partial_o[size_t(s * c.dim + d)];
  }
  for (double& x : o) x /= sum;
  return {o, m + std::log(sum)};
}

void check_case(const std::vector<int64_t>& chunks, int heads, int dim, bool sinks, bool with_lse,
                unsigned seed) {
  SCOPED_TRACE("heads " + std::to_string(heads) + " dim " + std::to_string(dim) +
               (sinks ? " with sinks" : "") + (with_lse ? "" : " without lse"));
  const MergeCase c = make_case(chunks, heads, dim, seed);
  MergeParams p = params_for(c, sinks);
  std::vector<float> lse_out(size_t(c.out_rows * heads));  // the recorder stores nothing here
  p.lse = with_lse ? lse_out.data() : nullptr;
  const MergeGrid g = merge_grid(p);
  EXPECT_EQ(g.threads % 32, 0u) << "whole warps";
  std::map<std::tuple<int64_t, int, int>, std::vector<float>> stores;
  merge_on_host(p, RecordingWriter{&stores});

  size_t expected_stores = 0;
  for (const MergeRow& row : c.rows) {
    for (int h = 0; h < heads; ++h) {
      const auto [o, lse] = merged(c, row, h, sinks);
      for (int d = with_lse ? -1 : 0; d < dim; ++d) {
        const auto it = stores.find({row.out_row, h, d});
        ASSERT_TRUE(it != stores.end())
            << "row " << row.out_row << " head " << h << " dim " << d << " never stored";
        ASSERT_EQ(it->second.size(), 1u) << "row " << row.out_row << " head " << h << " dim " << d
                                         << " stored " << it->second.size() << " times";
        const double want = d < 0 ? lse : o[size_t(d)];
        const double got = it->second[0];
        if (std::isinf(want)) {
          EXPECT_EQ(got, want) << "row " << row.out_row << " head " << h;
        } else {
          EXPECT_NEAR(got, want, 1e-5 * (1.0 + std::abs(want)))
              << "row " << row.out_row << " head " << h << " dim " << d;
        }
        ++expected_stores;
      }
    }
  }
  EXPECT_EQ(stores.size(), expected_stores) << "a store outside the merged rows and heads";
}

// Chunk counts differ from row to row (fa2's and fa3's plans give every token of a request the
// same count, requests differ); 0 chunks: a row with nothing to merge gets o = 0, lse = -inf (or
// the sink), never NaN and never skipped.
const std::vector<int64_t> kChunks = {2, 5, 3, 0, 1, 7, 2};

TEST(SplitMerge, GridCoversEveryRowAndHeadOnce) {
  unsigned seed = 1;
  for (int heads : {1, 3, 5, 8, 13}) {       // 1, 3, 5, 13: not a multiple of the vector width
    for (int dim : {4, 12, 64, 128, 512}) {  // under a warp's vectors, one, and four warps
      for (bool sinks : {false, true}) check_case(kChunks, heads, dim, sinks, true, seed++);
      check_case(kChunks, heads, dim, false, false, seed++);  // no lse asked: none stored
    }
  }
}

// All of a row's chunks saw no key: o = 0 and lse = -inf (or the sink's LSE), not NaN.
TEST(SplitMerge, RowWhoseChunksSawNothing) {
  MergeCase c = make_case({3}, 2, 8, 7);
  for (float& x : c.partial_lse) x = -INFINITY;
  for (bool sink : {false, true}) {
    const MergeParams p = params_for(c, sink);
    std::vector<float> out(size_t(c.out_rows * c.heads * c.dim), NAN);
    std::vector<float> lse(size_t(c.out_rows * c.heads), NAN);
    MergeParams q = p;
    q.out = out.data();
    q.lse = lse.data();
    merge_on_host(q);  // the kernel's own writer
    for (int h = 0; h < c.heads; ++h) {
      EXPECT_EQ(lse[size_t(c.rows[0].out_row * c.heads + h)],
                sink ? c.sinks[size_t(h)] : -INFINITY);
      for (int d = 0; d < c.dim; ++d)
        EXPECT_EQ(out[size_t((c.rows[0].out_row * c.heads + h) * c.dim + d)], 0.0f);
    }
  }
}

// The kernel's writer stores out in its dtype at the strides given, and the LSE in the run's base.
TEST(SplitMerge, WriterHonoursDtypeStridesAndLseBase) {
  const MergeCase c = make_case({2, 3}, 3, 16, 11);
  for (OutKind kind : {OutKind::kF32, OutKind::kF16, OutKind::kBF16}) {
    MergeParams p = params_for(c, false);
    // out as [head, row, dim] with a padded row: strides other than the dense ones.
    p.o_stride_row = c.dim + 4;
    p.o_stride_head = c.out_rows * p.o_stride_row;
    p.out_kind = kind;
    p.lse_scale = 1.4426950408889634f;  // base 2
    std::vector<float> out32(size_t(c.heads * p.o_stride_head), NAN);
    std::vector<uint16_t> out16(out32.size(), 0xffff);
    std::vector<float> lse(size_t(c.out_rows * c.heads), NAN);
    p.out = kind == OutKind::kF32 ? static_cast<void*>(out32.data()) : out16.data();
    p.lse = lse.data();
    merge_on_host(p);
    for (const MergeRow& row : c.rows) {
      for (int h = 0; h < c.heads; ++h) {
        const auto [o, l] = merged(c, row, h, false);
        EXPECT_NEAR(lse[size_t(row.out_row * c.heads + h)], l * p.lse_scale,
                    1e-5 * (1 + std::abs(l)));
        for (int d = 0; d < c.dim; ++d) {
          const int64_t at = row.out_row * p.o_stride_row + h * p.o_stride_head + d;
          const float got = kind == OutKind::kF32   ? out32[size_t(at)]
                            : kind == OutKind::kF16 ? num::f16_to_f32(out16[size_t(at)])
                                                    : num::bf16_to_f32(out16[size_t(at)]);
          const double tol = kind == OutKind::kF32 ? 1e-5 : kind == OutKind::kF16 ? 1e-3 : 8e-3;
          EXPECT_NEAR(got, o[size_t(d)], tol * (1 + std::abs(o[size_t(d)])));
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvattn::cuda
