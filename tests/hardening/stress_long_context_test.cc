// A context of 1M tokens with split-KV, laid out so that element offsets pass 2^32: the pages
// of K and V sit 2^20 elements apart in an 8 GiB reservation of address space (only the touched
// bytes are ever backed by memory). An int32 page or token offset anywhere in a backend shows
// up as a wrong answer or a crash. Each backend is checked against a direct fp64 computation
// from the test's own values (the reference), and against the reference by the tolerance rule
// of testing/tolerance.h (the other backends), with kv_chunk_size forcing split-KV.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "hardening/backends_under_test.h"
#include "hardening/stress_util.h"
#include "kvattn/attention.h"
#include "testing/baseline.h"
#include "testing/tolerance.h"

namespace kvattn::hardening {
namespace {

constexpr int64_t kTokens = int64_t{1} << 20;
constexpr int64_t kPageSize = 256;
constexpr int64_t kPages = kTokens / kPageSize;    // 4096
constexpr int64_t kPageStride = int64_t{1} << 20;  // elements between pages: offsets reach 2^32
constexpr int64_t kDim = 4;
constexpr int64_t kChunk = int64_t{1} << 16;  // 16 KV chunks per request

// An address-space reservation that is only backed where written.
class Reservation {
 public:
  explicit Reservation(std::size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~Reservation() {
    if (data_) munmap(data_, bytes_);
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

struct LongContext {
  Problem problem;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, last_page_len;
  std::vector<float> q;
  std::vector<float> out, lse;
  AttentionArgs args;
};

class StressLongContext : public ::testing::TestWithParam<Op> {
 protected:
  static void SetUpTestSuite() {
    // bf16 K at page * 2^20, V half a page stride later: 4096 pages x 2^20 x 2 bytes = 8 GiB.
    reservation_ = new Reservation(static_cast<std::size_t>(kPages * kPageStride * 2));
    if (!reservation_->data()) return;
    auto* base = static_cast<uint16_t*>(reservation_->data());
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    // Token t lives on page kPages - 1 - t / kPageSize (reversed), so the last pages hold the
    // first tokens and the largest offsets are read early.
    keys_.resize(kTokens * kDim);
    values_.resize(kTokens * kDim);
    for (int64_t t = 0; t < kTokens; ++t) {
      const int64_t page = kPages - 1 - t / kPageSize, slot = t % kPageSize;
      for (int64_t d = 0; d < kDim; ++d) {
        const uint16_t kb = num::f32_to_bf16(dist(rng)), vb = num::f32_to_bf16(dist(rng));
        base[page * kPageStride + slot * kDim + d] = kb;
        base[page * kPageStride + kPageStride / 2 + slot * kDim + d] = vb;
        keys_[t * kDim + d] = num::bf16_to_f32(kb);
        values_[t * kDim + d] = num::bf16_to_f32(vb);
      }
    }
  }
  static void TearDownTestSuite() {
    delete reservation_;
    reservation_ = nullptr;
  }

  // Batch decode (one query) or batch prefill (3 causal queries at the end of the context) of
  // one request, one head, over the whole 1M-token cache.
  void make(Op op, LongContext* lc) {
    Problem& p = lc->problem;
    p.op = op;
    p.batch_size = 1;
    p.num_qo_heads = p.num_kv_heads = 1;
    p.head_dim_qk = p.head_dim_vo = kDim;
    p.page_size = kPageSize;
    p.q_dtype = DType::kF32;
    p.kv_dtype = DType::kBF16;
    p.o_dtype = DType::kF32;
    p.mask_mode = op == Op::kBatchPrefillPaged ? MaskMode::kCausal : MaskMode::kNone;
    const int64_t rows = op == Op::kBatchPrefillPaged ? 3 : 1;
    lc->q.resize(rows * kDim);
    for (int64_t i = 0; i < rows * kDim; ++i) lc->q[i] = 0.5f * std::sin(1.0f + i);
    lc->out.assign(rows * kDim, NAN);
    lc->lse.assign(rows, NAN);
    lc->kv_indptr = {0, static_cast<int32_t>(kPages)};
    lc->qo_indptr = {0, static_cast<int32_t>(rows)};
    lc->last_page_len = {static_cast<int32_t>(kPageSize)};
    for (int64_t i = 0; i < kPages; ++i)
      lc->kv_indices.push_back(static_cast<int32_t>(kPages - 1 - i));
    AttentionArgs& a = lc->args;
    a.q = TensorView::contiguous(lc->q.data(), DType::kF32, {rows, 1, kDim});
    const int64_t shape[4] = {kPages, kPageSize, 1, kDim};
    const int64_t strides[4] = {kPageStride, kDim, kDim, 1};
    auto* base = static_cast<uint16_t*>(reservation_->data());
    const int64_t bytes = kPages * kPageStride * 2;
    a.paged_k_cache = TensorView::strided(base, DType::kBF16, shape, strides, 4, bytes);
    a.paged_v_cache = TensorView::strided(base + kPageStride / 2, DType::kBF16, shape, strides, 4,
                                          bytes - kPageStride);
    a.kv_indptr = TensorView::contiguous(lc->kv_indptr.data(), DType::kI32, {2});
    a.kv_indices = TensorView::contiguous(lc->kv_indices.data(), DType::kI32, {kPages});
    a.kv_last_page_len = TensorView::contiguous(lc->last_page_len.data(), DType::kI32, {1});
    if (op == Op::kBatchPrefillPaged) {
      a.qo_indptr = TensorView::contiguous(lc->qo_indptr.data(), DType::kI32, {2});
    }
    a.out = TensorView::contiguous(lc->out.data(), DType::kF32, {rows, 1, kDim});
    a.lse = TensorView::contiguous(lc->lse.data(), DType::kF32, {rows, 1});
  }

  // Query row r's exact output and LSE in fp64 from the test's own copy of K and V.
  ExactSoftmax direct(const LongContext& lc, int64_t r, int64_t rows) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
    const int64_t visible = kTokens - (rows - 1 - r);  // causal, bottom-right aligned
    double m = -INFINITY;
    std::vector<double> s(visible);
    for (int64_t j = 0; j < visible; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < kDim; ++d) dot += double{lc.q[r * kDim + d]} * keys_[j * kDim + d];
      s[j] = dot * scale;
      m = std::max(m, s[j]);
    }
    double sum = 0;
    std::vector<double> acc(kDim, 0.0);
    for (int64_t j = 0; j < visible; ++j) {
      const double w = std::exp(s[j] - m);
      sum += w;
      for (int64_t d = 0; d < kDim; ++d) acc[d] += w * values_[j * kDim + d];
    }
    for (double& x : acc) x /= sum;
    return {acc, m + std::log(sum)};
  }

  static Reservation* reservation_;
  static std::vector<float> keys_, values_;
};

Reservation* StressLongContext::reservation_ = nullptr;
std::vector<float> StressLongContext::keys_;
std::vector<float> StressLongContext::values_;

TEST_P(StressLongContext, OneMillionTokensSplitKvPastInt32Offsets) {
  if (!reservation_->data()) GTEST_SKIP() << "cannot reserve 8 GiB of address space here";
  const Op op = GetParam();
  const int64_t rows = op == Op::kBatchPrefillPaged ? 3 : 1;

  // The reference: exact against the direct computation.
  LongContext ref;
  make(op, &ref);
  PlanOptions ref_options;
  ref_options.backend = "reference";
  Status s = kvattn::run(ref.problem, ref.args, ref_options);
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (int64_t r = 0; r < rows; ++r) {
    const ExactSoftmax e = direct(ref, r, rows);
    EXPECT_NEAR(ref.lse[r], e.lse, 1e-5) << "row " << r;
    for (int64_t d = 0; d < kDim; ++d) EXPECT_NEAR(ref.out[r * kDim + d], e.out[d], 1e-6);
  }

  // The baseline sizes the tolerance of the other backends (STYLE.md).
  LongContext base;
  make(op, &base);
  ASSERT_TRUE(testing::baseline_attention(base.problem, base.args).ok());

  for (const std::string& backend : backends_under_test()) {
    if (backend == "reference") continue;
    SCOPED_TRACE("backend " + backend);
    LongContext lc;
    make(op, &lc);
    PlanOptions options;
    options.backend = backend;
    options.kv_chunk_size = kChunk;
    Plan plan;
    s = kvattn::plan(lc.problem, lc.args, options, &plan);
    if (s.code() == ErrorCode::kNotSupported) {
      std::cerr << "[stress] " << backend << ": " << s.message() << '\n';
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.to_string();
    int64_t chunks = 0;
    for (const WorkItem& w : plan.work) chunks += w.partial >= 0 ? 1 : 0;
    std::cerr << "[stress] " << plan.backend << " cut 1M tokens into " << plan.work.size()
              << " work items, " << chunks << " of them split-KV chunks\n";
    if (op == Op::kBatchDecode) {
      EXPECT_GT(chunks, 1) << "kv_chunk_size " << kChunk << " did not split the request";
    }
    s = kvattn::run(plan, lc.args);
    ASSERT_TRUE(s.ok()) << s.to_string();
    const testing::CheckResult r = testing::compare_with_reference(
        lc.problem, rows, ref.out, ref.lse, base.out, base.lse, lc.out, lc.lse);
    EXPECT_TRUE(r.ok) << r.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Stress, StressLongContext,
                         ::testing::Values(Op::kBatchDecode, Op::kBatchPrefillPaged),
                         [](const auto& info) { return std::string(op_name(info.param)); });

}  // namespace
}  // namespace kvattn::hardening
