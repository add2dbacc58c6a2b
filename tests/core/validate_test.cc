// Validation unit tests: the building blocks (checked extents, overlap, output layouts), the
// messages (argument, value, rule), and the valid edge cases that must be accepted. The
// catalogue of bad inputs through the public API is tests/hardening/bad_input_*_test.cc.
#include "core/validate.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <random>
#include <vector>

#include "core/validate_tensor.h"
#include "hardening/fixtures.h"
#include "kvattn/attention.h"
#include "testing/case_builder.h"

namespace kvattn {
namespace {

using hardening::AppendFixture;
using hardening::AttentionFixture;
using hardening::MergeFixture;
using hardening::RopeFixture;

void expect_error(const Status& s, ErrorCode code, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& part : parts) {
    EXPECT_NE(s.message().find(part), std::string::npos)
        << "message lacks \"" << part << "\": " << s.message();
  }
}

TensorView raw_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                    std::initializer_list<int64_t> strides, int64_t buffer_bytes) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), t.shape.begin());
  std::copy(strides.begin(), strides.end(), t.strides.begin());
  t.buffer_bytes = buffer_bytes;
  return t;
}

// ---- building blocks ----

TEST(ValidateView, ExactExtentIsAcceptedOneByteLessIsNot) {
  std::vector<float> buf(2 * 3 * 4);
  TensorView t = raw_view(buf.data(), DType::kF32, {2, 3, 4}, {12, 4, 1}, 96);
  EXPECT_TRUE(validation::check_view(t, "t").ok());
  t.buffer_bytes = 95;
  expect_error(validation::check_view(t, "t"), ErrorCode::kOutOfBounds,
               {"t: shape [2, 3, 4]", "reaches 96 bytes", "buffer_bytes = 95"});
}

TEST(ValidateView, StridedViewReachesOnlyItsLastElement) {
  // Every other row of a [4, 8] buffer: the last reachable element is row 2's last.
  std::vector<float> buf(4 * 8);
  TensorView t = raw_view(buf.data(), DType::kF32, {2, 8}, {16, 1}, 24 * 4);
  EXPECT_TRUE(validation::check_view(t, "t").ok());
  EXPECT_EQ(validation::reachable_bytes(t), 24 * 4);
  t.buffer_bytes = 24 * 4 - 1;
  EXPECT_EQ(validation::check_view(t, "t").code(), ErrorCode::kOutOfBounds);
}

TEST(ValidateView, EmptyDimNeedsNoMemory) {
  TensorView t = raw_view(nullptr, DType::kBF16, {0, 8, 128}, {1024, 128, 1}, 0);
  EXPECT_TRUE(validation::check_view(t, "q").ok());
  EXPECT_EQ(validation::reachable_bytes(t), 0);
}

TEST(ValidateView, RefusesBeforeReadingHugeShapes) {
  // A pointer that must never be dereferenced: validation works from the numbers alone.
  void* bogus = reinterpret_cast<void*>(uintptr_t{0x1000});
  TensorView t = raw_view(bogus, DType::kF32, {int64_t{1} << 32, 8}, {8, 1}, 64);
  expect_error(validation::check_view(t, "k"), ErrorCode::kOutOfBounds, {"k: shape"});
  t = raw_view(bogus, DType::kF32, {int64_t{1} << 32, int64_t{1} << 32}, {int64_t{1} << 32, 1}, 64);
  expect_error(validation::check_view(t, "k"), ErrorCode::kOverflow, {"past the int64 range"});
  // Element offsets fit int64, the byte count (x2) does not.
  t = raw_view(bogus, DType::kF16, {int64_t{1} << 32, 2}, {int64_t{1} << 31, 1}, 64);
  EXPECT_EQ(validation::check_view(t, "k").code(), ErrorCode::kOverflow);
}

TEST(ValidateView, NamesTheBadField) {
  std::vector<float> buf(16);
  TensorView t = raw_view(buf.data(), DType::kF32, {4, 4}, {4, -1}, 64);
  expect_error(validation::check_view(t, "out"), ErrorCode::kOutOfBounds,
               {"out.strides[1] = -1", ">= 0"});
  t = raw_view(buf.data(), DType::kF32, {4, -4}, {4, 1}, 64);
  expect_error(validation::check_view(t, "out"), ErrorCode::kInvalidShape, {"out.shape[1] = -4"});
  t = raw_view(nullptr, DType::kF32, {4, 4}, {4, 1}, 64);
  expect_error(validation::check_view(t, "out"), ErrorCode::kInvalidArgument, {"out.data is null"});
  t = raw_view(buf.data(), static_cast<DType>(99), {4, 4}, {4, 1}, 64);
  EXPECT_EQ(validation::check_view(t, "out").code(), ErrorCode::kInvalidDType);
  t = raw_view(buf.data(), DType::kF32, {4, 4}, {4, 1}, 64);
  t.rank = kMaxRank + 1;
  EXPECT_EQ(validation::check_view(t, "out").code(), ErrorCode::kInvalidShape);
}

TEST(ValidateView, OverlapIsByteExact) {
  std::vector<float> buf(32);
  TensorView a = raw_view(buf.data(), DType::kF32, {8}, {1}, 32);
  TensorView b = raw_view(buf.data() + 8, DType::kF32, {8}, {1}, 32);
  EXPECT_FALSE(validation::overlaps(a, b));  // adjacent, not overlapping
  b.data = buf.data() + 7;
  EXPECT_TRUE(validation::overlaps(a, b));
  b.memory = MemoryKind::kCuda;  // another memory: same numbers, different bytes
  EXPECT_FALSE(validation::overlaps(a, b));
  expect_error(validation::check_no_overlap(a, "out", a, "q"), ErrorCode::kAliasing,
               {"out", "overlaps q"});
}

TEST(ValidateView, OverlapIsElementExactForStridedViews) {
  // A packed qkv tensor [n, (Hq + 2 Hk) * D] split into q [n, Hq, D], k and v [n, Hk, D].
  const int64_t n = 5, hq = 4, hk = 2, d = 8, row = (hq + 2 * hk) * d;
  std::vector<uint16_t> qkv(n * row);
  const int64_t bytes = static_cast<int64_t>(qkv.size()) * 2;
  TensorView q = raw_view(qkv.data(), DType::kBF16, {n, hq, d}, {row, d, 1}, bytes);
  TensorView k = raw_view(qkv.data() + hq * d, DType::kBF16, {n, hk, d}, {row, d, 1},
                          bytes - hq * d * 2);
  TensorView v = raw_view(qkv.data() + (hq + hk) * d, DType::kBF16, {n, hk, d}, {row, d, 1},
                          bytes - (hq + hk) * d * 2);
  EXPECT_FALSE(validation::overlaps(q, k));
  EXPECT_FALSE(validation::overlaps(k, q));
  EXPECT_FALSE(validation::overlaps(q, v));
  EXPECT_FALSE(validation::overlaps(k, v));
  EXPECT_TRUE(validation::check_no_overlap(q, "q_out", k, "k").ok());
  // One element more of q's heads reaches k's first element: a true overlap.
  TensorView q5 = raw_view(qkv.data(), DType::kBF16, {n, hq + 1, d}, {row, d, 1}, bytes);
  EXPECT_TRUE(validation::overlaps(q5, k));
  EXPECT_TRUE(validation::overlaps(k, q5));
  // Only the last row: q's last element is shared.
  TensorView q_tail = q;
  q_tail.shape = {1, hq, d + 1};  // rows of d + 1 elements step one into the next head
  q_tail.data = qkv.data() + (n - 1) * row;
  q_tail.buffer_bytes = row * 2;
  TensorView k_tail = raw_view(qkv.data() + (n - 1) * row + hq * d, DType::kBF16, {1, hk, d},
                               {row, d, 1}, (row - hq * d) * 2);
  EXPECT_TRUE(validation::overlaps(q_tail, k_tail));
  // Interleaved elements: even and odd columns of one [8, 16] f32 buffer share no byte.
  std::vector<float> buf(8 * 16);
  TensorView even = raw_view(buf.data(), DType::kF32, {8, 8}, {16, 2}, 8 * 16 * 4);
  TensorView odd = raw_view(buf.data() + 1, DType::kF32, {8, 8}, {16, 2}, 8 * 16 * 4 - 4);
  EXPECT_FALSE(validation::overlaps(even, odd));
  EXPECT_FALSE(validation::overlaps(odd, even));
  // A bf16 view over the same bytes reads half of an odd f32 element: they share a byte.
  TensorView halves = raw_view(buf.data(), DType::kBF16, {8, 8}, {32, 3}, 8 * 16 * 4);
  EXPECT_TRUE(validation::overlaps(even, halves) || validation::overlaps(odd, halves));
  TensorView odd_halves =
      raw_view(reinterpret_cast<uint16_t*>(buf.data()) + 2, DType::kBF16, {8, 4}, {32, 4},
               8 * 16 * 4 - 4);  // the first half of every odd f32 element
  EXPECT_FALSE(validation::overlaps(even, odd_halves));
  EXPECT_TRUE(validation::overlaps(odd, odd_halves));
  // Columns 0..3 and 2..5: truly overlapping.
  TensorView left = raw_view(buf.data(), DType::kF32, {8, 4}, {16, 1}, 8 * 16 * 4);
  TensorView mid = raw_view(buf.data() + 2, DType::kF32, {8, 4}, {16, 1}, 8 * 16 * 4 - 8);
  EXPECT_TRUE(validation::overlaps(left, mid));
  TensorView right = raw_view(buf.data() + 4, DType::kF32, {8, 4}, {16, 1}, 8 * 16 * 4 - 16);
  EXPECT_FALSE(validation::overlaps(left, right));
  // A broadcast input (stride 0) against a strided output: exact by enumerating the output.
  TensorView bcast = raw_view(buf.data() + 5, DType::kF32, {8, 3}, {0, 1}, 12);
  EXPECT_FALSE(validation::overlaps(left, bcast));  // columns 5..7 of row 0
  bcast.data = buf.data() + 3;
  EXPECT_TRUE(validation::overlaps(left, bcast));  // column 3 of row 0
  // Brute force over small random views of one buffer: exact agreement.
  std::mt19937 rng(7);
  std::vector<uint8_t> bytes_buf(512);
  for (int trial = 0; trial < 3000; ++trial) {
    auto random_view = [&]() {
      const DType dt = rng() % 2 ? DType::kF32 : DType::kBF16;
      const int64_t es = dtype_size(dt);
      const int rank = 1 + static_cast<int>(rng() % 3);
      std::vector<int64_t> shape(rank), strides(rank);
      int64_t reach = 0;
      for (int i = 0; i < rank; ++i) {
        shape[i] = 1 + rng() % 4;
        strides[i] = rng() % 9;
        reach += (shape[i] - 1) * strides[i];
      }
      const int64_t extent = (reach + 1) * es;
      const int64_t offset = (rng() % (512 - extent + 1)) / es * es;
      TensorView t;
      t.data = bytes_buf.data() + offset;
      t.dtype = dt;
      t.rank = rank;
      for (int i = 0; i < rank; ++i) {
        t.shape[i] = shape[i];
        t.strides[i] = strides[i];
      }
      t.buffer_bytes = 512 - offset;
      return t;
    };
    const TensorView x = random_view(), y = random_view();
    auto touched = [&](const TensorView& t) {
      std::vector<bool> m(512, false);
      const int64_t es = dtype_size(t.dtype);
      const int64_t base = static_cast<const uint8_t*>(t.data) - bytes_buf.data();
      for (int64_t i0 = 0; i0 < t.shape[0]; ++i0)
        for (int64_t i1 = 0; i1 < (t.rank > 1 ? t.shape[1] : 1); ++i1)
          for (int64_t i2 = 0; i2 < (t.rank > 2 ? t.shape[2] : 1); ++i2) {
            const int64_t e = i0 * t.strides[0] + (t.rank > 1 ? i1 * t.strides[1] : 0) +
                              (t.rank > 2 ? i2 * t.strides[2] : 0);
            for (int64_t b = 0; b < es; ++b) m[base + e * es + b] = true;
          }
      return m;
    };
    const std::vector<bool> mx = touched(x), my = touched(y);
    bool shared = false;
    for (int i = 0; i < 512; ++i) shared |= mx[i] && my[i];
    const bool got = validation::overlaps(x, y);
    ASSERT_EQ(got, shared) << "trial " << trial << ": " << x.shape_string() << " strides "
                           << x.strides[0] << " vs " << y.shape_string();
  }
}

TEST(ValidateView, OutputLayoutsThatRepeatAnAddress) {
  std::vector<float> buf(64);
  // Transposed but one-to-one: fine.
  EXPECT_TRUE(
      validation::check_output_layout(raw_view(buf.data(), DType::kF32, {4, 8}, {1, 4}, 128), "o")
          .ok());
  // Broadcast dim of size 1 with stride 0: fine.
  EXPECT_TRUE(
      validation::check_output_layout(raw_view(buf.data(), DType::kF32, {1, 8}, {0, 1}, 32), "o")
          .ok());
  expect_error(
      validation::check_output_layout(raw_view(buf.data(), DType::kF32, {4, 8}, {0, 1}, 32), "o"),
      ErrorCode::kAliasing, {"o: strides [0, 1]"});
  // Rows of 8 elements 4 apart interleave.
  EXPECT_EQ(
      validation::check_output_layout(raw_view(buf.data(), DType::kF32, {4, 8}, {4, 1}, 80), "o")
          .code(),
      ErrorCode::kAliasing);
}

// ---- messages of the attention validator ----

TEST(ValidateAttention, PageTableMessagesNameArgumentValueAndRule) {
  AttentionFixture f(Op::kBatchDecode);
  f.kv_indptr = {0, 7, 5, 5};
  expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidPageTable,
               {"kv_indptr[2] = 5: must be >= kv_indptr[1] = 7 (non-decreasing)"});
  AttentionFixture g(Op::kBatchPrefillPaged);
  g.kv_indices[3] = 9;
  expect_error(validate_attention(g.problem, g.args), ErrorCode::kInvalidPageTable,
               {"kv_indices[3] = 9", "[0, num_pages = 7)"});
  AttentionFixture h(Op::kBatchDecode);
  h.kv_last_page_len[2] = 0;
  expect_error(validate_attention(h.problem, h.args), ErrorCode::kInvalidPageTable,
               {"kv_last_page_len[2] = 0", "[1, page_size = 4]"});
}

TEST(ValidateAttention, ShapeMessagesNameTheRule) {
  AttentionFixture f(Op::kBatchPrefillRagged);
  f.args.q.shape[1] = 2;
  expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidShape,
               {"q.shape[1] = 2", "num_qo_heads = 4"});
  AttentionFixture g(Op::kBatchPrefillRagged);
  g.kv_indptr[3] = 12;
  expect_error(validate_attention(g.problem, g.args), ErrorCode::kInvalidPageTable,
               {"kv_indptr[3] = 12", "rows of k = 14"});
  AttentionFixture h(Op::kSinglePrefill, MaskMode::kCustom);
  h.args.custom_mask.shape[0] = 20;
  expect_error(validate_attention(h.problem, h.args), ErrorCode::kInvalidShape,
               {"custom_mask", "[21]"});
}

TEST(ValidateAttention, EmptyBatchIsRefusedByName) {
  AttentionFixture f(Op::kBatchDecode);
  f.problem.batch_size = 0;
  expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidShape,
               {"batch_size = 0", "empty batch"});
}

// ---- valid edge cases that must pass ----

TEST(ValidateAttention, AcceptsEveryFixture) {
  for (Op op : {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode, Op::kBatchPrefillPaged,
                Op::kBatchPrefillRagged}) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (bool packed : {false, true}) {
        AttentionFixture f(op, MaskMode::kCustom, packed, layout);
        Status s = validate_attention(f.problem, f.args);
        EXPECT_TRUE(s.ok()) << op_name(op) << ": " << s.to_string();
      }
    }
  }
}

TEST(ValidateAttention, AcceptsBoundaryPageTables) {
  AttentionFixture f(Op::kBatchDecode);
  // Full last pages, a request without pages whose last_page_len is not read, a page used by
  // two requests (shared prefix) and extra kv_indices entries past kv_indptr[B].
  f.kv_last_page_len = {4, 123, 4};
  f.kv_indices = {6, 1, 6, 0, 4, 99};
  f.args.kv_indices = hardening::i32_view(f.kv_indices);
  Status s = validate_attention(f.problem, f.args);
  EXPECT_TRUE(s.ok()) << s.to_string();
  // Every request empty.
  f.kv_indptr = {0, 0, 0, 0};
  s = validate_attention(f.problem, f.args);
  EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(ValidateAttention, AcceptsCombinedCacheViews) {
  // One [P, 2, page_size, H_kv, D] buffer; K and V are interleaved strided views of it.
  AttentionFixture f(Op::kBatchDecode);
  f.problem.head_dim_vo = f.problem.head_dim_qk;
  const int64_t p = 7, ps = 4, hk = 2, d = 8, page = ps * hk * d;
  std::vector<float> combined(p * 2 * page);
  const int64_t shape[4] = {p, ps, hk, d};
  const int64_t strides[4] = {2 * page, hk * d, d, 1};
  const int64_t bytes = static_cast<int64_t>(combined.size() * sizeof(float));
  f.args.paged_k_cache =
      TensorView::strided(combined.data(), DType::kF32, shape, strides, 4, bytes);
  f.args.paged_v_cache =
      TensorView::strided(combined.data() + page, DType::kF32, shape, strides, 4, bytes - page * 4);
  f.out.assign(3 * 4 * 8, 0.0f);
  f.args.out = hardening::f32_view(f.out, {3, 4, 8});
  Status s = validate_attention(f.problem, f.args);
  EXPECT_TRUE(s.ok()) << s.to_string();
  // The V view one element too long for what is left of the buffer.
  f.args.paged_v_cache.buffer_bytes -= 4;
  EXPECT_EQ(validate_attention(f.problem, f.args).code(), ErrorCode::kOutOfBounds);
}

TEST(ValidateAttention, AcceptsEveryCaseBuilderLayout) {
  // The random cases the rest of the tests use must all pass validation.
  for (Op op : {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode, Op::kBatchPrefillPaged,
                Op::kBatchPrefillRagged}) {
    for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      for (bool combined : {false, true}) {
        for (MaskMode mask : {MaskMode::kNone, MaskMode::kCausal, MaskMode::kCustom}) {
          testing::CaseSpec spec;
          spec.problem.op = op;
          spec.problem.kv_layout = layout;
          spec.problem.mask_mode = mask;
          spec.problem.num_qo_heads = 4;
          spec.problem.num_kv_heads = 2;
          spec.problem.head_dim_qk = spec.problem.head_dim_vo = 16;
          spec.problem.page_size = 3;
          spec.return_lse = mask != MaskMode::kNone;
          spec.problem.batch_size = is_batch(op) ? 3 : 1;
          spec.kv_lens = is_batch(op) ? std::vector<int64_t>{7, 0, 3} : std::vector<int64_t>{5};
          spec.combined_kv_cache = combined;
          spec.packed_custom_mask = combined;
          testing::Case c = testing::Case::make(spec);
          AttentionArgs args = c.args();
          Status s = validate_attention(c.problem(), args);
          EXPECT_TRUE(s.ok()) << c.problem().to_string() << ": " << s.to_string();
        }
      }
    }
  }
}

// ---- plans ----

TEST(ValidatePlan, EveryBackendsPlansPass) {
  // Plans of every backend (split-KV forced on some) over random cases, as run() will see them.
  for (Op op : {Op::kSingleDecode, Op::kSinglePrefill, Op::kBatchDecode, Op::kBatchPrefillPaged,
                Op::kBatchPrefillRagged}) {
    for (int64_t chunk : {int64_t{0}, int64_t{3}}) {
      testing::CaseSpec spec;
      spec.problem.op = op;
      spec.problem.num_qo_heads = 4;
      spec.problem.num_kv_heads = 2;
      spec.problem.head_dim_qk = spec.problem.head_dim_vo = 16;
      spec.problem.page_size = 4;
      spec.problem.q_dtype = spec.problem.kv_dtype = spec.problem.o_dtype = DType::kF32;
      spec.problem.mask_mode = MaskMode::kCausal;
      spec.problem.batch_size = is_batch(op) ? 3 : 1;
      spec.kv_lens = is_batch(op) ? std::vector<int64_t>{17, 0, 9} : std::vector<int64_t>{13};
      testing::Case c = testing::Case::make(spec);
      AttentionArgs args = c.args();
      for (const char* backend : {"reference", "cpu"}) {
        PlanOptions options;
        options.backend = backend;
        options.kv_chunk_size = chunk;
        Plan plan;
        Status s = kvattn::plan(c.problem(), args, options, &plan);
        ASSERT_TRUE(s.ok()) << backend << ": " << s.to_string();
        s = validate_plan(plan);
        EXPECT_TRUE(s.ok()) << backend << " " << op_name(op) << ": " << s.to_string();
      }
    }
  }
}

TEST(ValidatePlan, RefusesWorkOutsideTheRequests) {
  AttentionFixture f(Op::kBatchPrefillPaged);
  PlanOptions options;
  options.backend = "reference";
  Plan good;
  ASSERT_TRUE(kvattn::plan(f.problem, f.args, options, &good).ok());
  ASSERT_TRUE(validate_plan(good).ok());
  auto refused = [&](const std::function<void(Plan&)>& mutate, const std::string& part) {
    Plan p = good;
    mutate(p);
    expect_error(validate_plan(p), ErrorCode::kInvalidArgument, {part});
    // run() refuses it before any backend reads past a request.
    expect_error(kvattn::run(p, f.args), ErrorCode::kInvalidArgument, {part});
  };
  refused([](Plan& p) { p.work[0].kv_end = p.kv_len[p.work[0].request] + 1; }, "keys [");
  refused([](Plan& p) { p.work[1].qo_end = 1000; }, "queries [");
  refused([](Plan& p) { p.work[2].qo_begin = -1; }, "queries [-1");
  refused([](Plan& p) { p.work[0].request = 3; }, "request 3");
  refused([](Plan& p) { p.work[0].kv_head = 2; }, "kv_head 2");
  refused([](Plan& p) { p.num_partial_states = -1; }, "num_partial_states = -1");
  Plan short_lengths = good;
  short_lengths.qo_len.pop_back();
  expect_error(validate_plan(short_lengths), ErrorCode::kInvalidArgument, {"lengths for 2"});
}

// Issue 11: the sinks and scale tensors, by name, value and rule.
TEST(ValidateAttention, SinkAndScaleMessagesNameArgumentValueAndRule) {
  {
    AttentionFixture f(Op::kBatchDecode);
    f.sinks.assign(4, 0.0f);
    f.args.sinks = hardening::f32_view(f.sinks, {4});
    expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidArgument,
                 {"sinks: given, but use_sinks is false", "use_sinks=true"});
    f.problem.use_sinks = true;
    f.args.sinks = TensorView{};  // use_sinks: a layer may pass sinks; this one has none
    EXPECT_TRUE(validate_attention(f.problem, f.args).ok());
    f.sinks[2] = std::numeric_limits<float>::infinity();
    f.args.sinks = hardening::f32_view(f.sinks, {4});
    expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidArgument,
                 {"sinks[2] = inf", "finite"});
    f.sinks[2] = -30.0f;  // any finite logit is a valid sink
    EXPECT_TRUE(validate_attention(f.problem, f.args).ok());
    // A sinks view its buffer does not hold is refused before a value is read (fuzz_attention
    // found the bound check lost when sinks became a run value: ASan read past the buffer).
    f.args.sinks.buffer_bytes = 4 * 4 - 1;
    expect_error(validate_attention(f.problem, f.args), ErrorCode::kOutOfBounds,
                 {"sinks: shape [4]", "buffer_bytes = 15"});
  }
  {
    // Paged per-(token, head) scales: the bad slot is named by (page, slot, head).
    AttentionFixture f(Op::kBatchDecode);
    f.problem.kv_dtype = DType::kE4M3;
    f.args.paged_k_cache.dtype = f.args.paged_v_cache.dtype = DType::kE4M3;
    f.problem.kv_scale_granularity = KVScaleGranularity::kPerTokenHead;
    const int64_t pages = f.num_pages, ps = f.problem.page_size, hk = f.problem.num_kv_heads;
    f.k_scale_cache.assign(static_cast<std::size_t>(pages * ps * hk), 1.0f);
    f.v_scale_cache = f.k_scale_cache;
    f.args.k_scale_cache = hardening::f32_view(f.k_scale_cache, {pages, ps, hk});
    f.args.v_scale_cache = hardening::f32_view(f.v_scale_cache, {pages, ps, hk});
    EXPECT_TRUE(validate_attention(f.problem, f.args).ok());
    const int32_t page = f.kv_indices[0];
    f.v_scale_cache[static_cast<std::size_t>((page * ps + 1) * hk + 1)] = -2.0f;
    expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidScale,
                 {"v_scale_cache[" + std::to_string(page) + ", 1, 1] = -2",
                  "finite and positive"});
    // The edges of "finite and positive" (the pass over a page's bits, validate_variants.cc):
    // zeros, inf and NaN refused, the smallest denormal and the largest float taken.
    const std::size_t slot = static_cast<std::size_t>((page * ps + 2) * hk);
    for (float bad : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      f.v_scale_cache.assign(f.v_scale_cache.size(), 1.0f);
      f.v_scale_cache[slot] = bad;
      expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidScale,
                   {"v_scale_cache[" + std::to_string(page) + ", 2, 0]", "finite and positive"});
    }
    for (float good :
         {std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()}) {
      f.v_scale_cache[slot] = good;
      EXPECT_TRUE(validate_attention(f.problem, f.args).ok()) << good;
    }
    f.v_scale_cache.assign(f.v_scale_cache.size(), 1.0f);
    // A slot no request reads may hold anything (unwritten cache slots).
    f.k_scale_cache.back() = std::numeric_limits<float>::quiet_NaN();
    bool read = false;
    for (int32_t id : f.kv_indices) read |= id == pages - 1;
    if (!read) EXPECT_TRUE(validate_attention(f.problem, f.args).ok());
    f.args.k_scale_cache.shape[1] = ps - 1;
    expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidShape,
                 {"k_scale_cache", "page_size"});
  }
  {
    AttentionFixture f(Op::kSinglePrefill);
    f.problem.kv_scale_granularity = KVScaleGranularity::kPerHead;
    expect_error(validate_attention(f.problem, f.args), ErrorCode::kInvalidArgument,
                 {"kv_scale_granularity per_head", "kv dtype is f32"});
  }
}

// ---- aux ops ----

TEST(ValidateOps, AcceptsFixturesAndInPlaceRope) {
  MergeFixture m;
  EXPECT_TRUE(validate_merge_state(m.tv_a, m.ts_a, m.tv_b, m.ts_b, m.tv_out, m.ts_out).ok());
  EXPECT_TRUE(validate_merge_states(m.tv_many, m.ts_many, m.tv_merged, m.ts_merged).ok());
  EXPECT_TRUE(validate_merge_states(m.tv_many, m.ts_many, m.tv_merged, TensorView{}).ok());
  AppendFixture a(DType::kE4M3, KVLayout::kHND);
  EXPECT_TRUE(validate_append_paged_kv_cache(a.tappend_k, a.tappend_v, a.tbatch_indices,
                                             a.tpositions, a.cache)
                  .ok());
  RopeFixture r;
  EXPECT_TRUE(validate_apply_rope(r.tq, r.tk, r.tq_out, r.tk_out, r.tpos_ids, r.rope).ok());
  EXPECT_TRUE(validate_apply_rope(r.tq, r.tk, r.tq, r.tk, r.tpos_ids, r.rope).ok());
  // Only k: q is neither read nor checked.
  EXPECT_TRUE(
      validate_apply_rope(TensorView{}, r.tk, TensorView{}, r.tk_out, r.tpos_ids, r.rope).ok());
}

TEST(ValidateOps, AppendMessagesNameTheRequest) {
  AppendFixture a;
  a.positions[2] = 9;
  expect_error(validate_append_paged_kv_cache(a.tappend_k, a.tappend_v, a.tbatch_indices,
                                              a.tpositions, a.cache),
               ErrorCode::kOutOfBounds, {"positions[2] = 9", "kv_len of request 2 = 9"});
}

TEST(ValidateOps, AppendPaddedRowsAreAcceptedWithAnyPosition) {
  AppendFixture a;
  a.batch_indices[1] = kPaddedAppendRow;
  a.positions[1] = -12345;  // a padded row's position is not read
  EXPECT_TRUE(validate_append_paged_kv_cache(a.tappend_k, a.tappend_v, a.tbatch_indices,
                                             a.tpositions, a.cache)
                  .ok());
  a.batch_indices[1] = -2;
  expect_error(validate_append_paged_kv_cache(a.tappend_k, a.tappend_v, a.tbatch_indices,
                                              a.tpositions, a.cache),
               ErrorCode::kOutOfBounds, {"batch_indices[1] = -2", "or -1 (a padded row"});
}

TEST(ValidateOps, RopeInPlaceMustBeTheSameView) {
  RopeFixture r;
  TensorView q_out = r.tq;
  q_out.strides = {32, 1, 4};  // same bytes, heads and dims swapped: not in place
  q_out.shape = {5, 4, 8};
  expect_error(validate_apply_rope(r.tq, r.tk, q_out, r.tk_out, r.tpos_ids, r.rope),
               ErrorCode::kAliasing, {"q_out", "overlaps q"});
}

}  // namespace
}  // namespace kvattn
