// fa2 as an engine drives it, checked without a GPU through a recording RuntimeCalls
// (src/cuda/fa2/runtime_calls.h): plan makes the persistent device workspace (the schedule and
// page table, copied from pinned staging on the caller's stream) and run issues nothing but
// kernel launches on the caller's stream (so it can be captured in a CUDA graph); the aux
// operations put every allocation, copy and launch on their stream; every call restores the
// caller's current device. The "device" memory here is host memory that the recorder hands out,
// so the workspace's contents are checked too. Nothing is executed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "cuda/common/split_merge.h"
#include "cuda/fa2/params.h"
#include "cuda/fa2/plan_state.h"
#include "cuda/fa2/runtime_calls.h"
#include "cuda/fa2/schedule.h"
#include "kvattn/kvattn.h"

namespace kvattn::fa2 {
namespace {

void* const kStream = reinterpret_cast<void*>(0x5eed);

struct Call {
  std::string name;
  bool has_stream = false;
  void* stream = nullptr;
  const void* kernel = nullptr;
  Dim3 grid, block;
  std::size_t shared_bytes = 0;
};

class RecordingRuntime final : public RuntimeCalls {
 public:
  std::vector<Call> calls;
  int current_device = 0;
  int fail_malloc_device = 0;                          // non-zero: malloc_device returns it
  std::map<void*, std::unique_ptr<std::byte[]>> live;  // outstanding allocations
  std::vector<AttentionParams> attention_params;       // the first argument of first launches
  std::vector<cuda::MergeParams> merge_params;         // the argument of split-merge launches

  void clear() {
    calls.clear();
    attention_params.clear();
    merge_params.clear();
  }
  int get_device(int* d) override {
    calls.push_back({"get_device"});
    *d = current_device;
    return 0;
  }
  int set_device(int d) override {
    calls.push_back({"set_device"});
    current_device = d;
    return 0;
  }
  int sm_count(int, int* count) override {
    calls.push_back({"sm_count"});
    *count = 132;
    return 0;
  }
  int malloc_device(void** p, std::size_t bytes) override {
    calls.push_back({"malloc_device"});
    if (fail_malloc_device) return fail_malloc_device;
    *p = allocate(bytes);
    return 0;
  }
  int free_device(void* p) override {
    calls.push_back({"free_device"});
    return release(p);
  }
  int malloc_pinned(void** p, std::size_t bytes) override {
    calls.push_back({"malloc_pinned"});
    *p = allocate(bytes);
    return 0;
  }
  int free_pinned(void* p) override {
    calls.push_back({"free_pinned"});
    return release(p);
  }
  int malloc_async(void** p, std::size_t bytes, void* stream) override {
    calls.push_back({"malloc_async", true, stream});
    *p = allocate(bytes);
    return 0;
  }
  int free_async(void* p, void* stream) override {
    calls.push_back({"free_async", true, stream});
    return release(p);
  }
  int copy_to_device_async(void* dst, const void* src, std::size_t bytes, void* stream) override {
    calls.push_back({"copy_to_device_async", true, stream});
    std::memcpy(dst, src, bytes);
    return 0;
  }
  int stream_synchronize(void* stream) override {
    calls.push_back({"stream_synchronize", true, stream});
    return 0;
  }
  int set_max_dynamic_shared_memory(const void* kernel, int bytes) override {
    Call c{"set_max_dynamic_shared_memory"};
    c.kernel = kernel;
    c.shared_bytes = std::size_t(bytes);
    calls.push_back(c);
    return 0;
  }
  int launch(const void* kernel, Dim3 grid, Dim3 block, void** args, std::size_t shared_bytes,
             void* stream) override {
    Call c{"launch", true, stream, kernel, grid, block, shared_bytes};
    // The attention kernel is always run's first launch; its only argument is the params.
    if (std::none_of(calls.begin(), calls.end(),
                     [](const Call& x) { return x.name == "launch"; })) {
      attention_params.push_back(*static_cast<const AttentionParams*>(args[0]));
    } else if (kernel == cuda::split_merge_kernel()) {
      merge_params.push_back(*static_cast<const cuda::MergeParams*>(args[0]));
    }
    calls.push_back(c);
    return 0;
  }
  const char* error_string(int error) override {
    return error == 2 ? "out of memory (recorded)" : "recorded error";
  }

  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const Call& c : calls) n.push_back(c.name);
    return n;
  }
  bool owns(const void* p, std::size_t bytes) const {
    for (const auto& [base, mem] : live) {
      (void)mem;
      const auto* b = static_cast<const std::byte*>(base);
      const auto* q = static_cast<const std::byte*>(p);
      if (q >= b && q + bytes <= b + sizes.at(base)) return true;
    }
    return false;
  }

 private:
  std::map<void*, std::size_t> sizes;
  void* allocate(std::size_t bytes) {
    auto mem = std::make_unique<std::byte[]>(bytes + 256);
    void* p = mem.get();
    live[p] = std::move(mem);
    sizes[p] = bytes;
    return p;
  }
  int release(void* p) {
    if (!live.erase(p)) return 1;  // freeing what was not allocated
    sizes.erase(p);
    return 0;
  }
};

// Substitutes the recorder for the test's lifetime (declared before the plans it outlives).
class Fa2Stream : public ::testing::Test {
 protected:
  void SetUp() override { previous_ = substitute_runtime(&rt_); }
  void TearDown() override { substitute_runtime(previous_); }
  RecordingRuntime rt_;

 private:
  RuntimeCalls* previous_ = nullptr;
};

// A batch decode over a paged bf16 cache at head dim 128 (a kernel of the CI set): three requests,
// one long enough to be split by a forced 256-key chunk, one empty.
struct DecodeCase {
  Problem p;
  std::vector<int32_t> indptr{0, 2, 22, 22}, indices, last{7, 16, 0};
  std::vector<std::byte> q, cache, out, lse;
  AttentionArgs args;

  DecodeCase() {
    p.op = Op::kBatchDecode;
    p.batch_size = 3;
    p.num_qo_heads = 8;
    p.num_kv_heads = 2;
    p.head_dim_qk = p.head_dim_vo = 128;
    p.page_size = 16;
    p.q_dtype = p.kv_dtype = p.o_dtype = DType::kBF16;
    const int pages = 24;
    for (int i = 0; i < indptr.back(); ++i) indices.push_back((i * 7) % pages);
    last[2] = 1;  // an empty request has no pages; its last_page_len is still in [1, page_size]
    q.resize(3 * 8 * 128 * 2);
    cache.resize(std::size_t(pages) * 2 * 16 * 2 * 128 * 2);
    out.resize(q.size());
    lse.resize(3 * 8 * 4);
    args.q = TensorView::contiguous(q.data(), DType::kBF16, {3, 8, 128});
    args.q.memory = MemoryKind::kCuda;
    // A combined [P, 2, page_size, H_kv, D] cache as two strided views.
    args.paged_k_cache = TensorView::strided(cache.data(), DType::kBF16, {pages, 16, 2, 128},
                                             {2 * 16 * 2 * 128, 2 * 128, 128, 1});
    args.paged_v_cache =
        TensorView::strided(cache.data() + 16 * 2 * 128 * 2, DType::kBF16, {pages, 16, 2, 128},
                            {2 * 16 * 2 * 128, 2 * 128, 128, 1});
    args.paged_k_cache.memory = args.paged_v_cache.memory = MemoryKind::kCuda;
    args.kv_indptr = TensorView::contiguous(indptr.data(), DType::kI32, {4});
    args.kv_indices =
        TensorView::contiguous(indices.data(), DType::kI32, {int64_t(indices.size())});
    args.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {3});
    args.out = TensorView::contiguous(out.data(), DType::kBF16, {3, 8, 128});
    args.out.memory = MemoryKind::kCuda;
    args.lse = TensorView::contiguous(lse.data(), DType::kF32, {3, 8});
    args.lse.memory = MemoryKind::kCuda;
  }
};

PlanOptions fa2_options(int64_t chunk) {
  PlanOptions o;
  o.backend = "fa2";
  o.device = Device::cuda_sm(80);
  o.device.index = 1;  // not the current device: plan and run must switch and switch back
  o.stream = kStream;
  o.kv_chunk_size = chunk;
  return o;
}

// What kvattn::plan does, without the availability check (there is no GPU here).
Status plan_fa2(const DecodeCase& c, const PlanOptions& o, Plan* plan) {
  return fa2_backend().plan(c.p, c.args, o, plan);
}

TEST_F(Fa2Stream, PlanFillsThePersistentWorkspaceOnTheCallersStream) {
  DecodeCase c;
  Plan plan;
  ASSERT_TRUE(plan_fa2(c, fa2_options(256), &plan).ok());
  EXPECT_EQ(plan.stream, kStream);
  EXPECT_EQ(rt_.current_device, 0) << "plan left the thread on another device";
  for (const Call& call : rt_.calls) {
    if (call.has_stream) EXPECT_EQ(call.stream, kStream) << call.name << " not on the stream";
  }
  const std::vector<std::string> n = rt_.names();
  for (const char* expected :
       {"malloc_device", "malloc_pinned", "copy_to_device_async", "stream_synchronize",
        "free_pinned", "set_max_dynamic_shared_memory"}) {
    EXPECT_EQ(std::count(n.begin(), n.end(), expected), 1) << expected;
  }

  // The workspace holds exactly the schedule and page table that make_schedule gives.
  const auto* state = static_cast<const PlanState*>(plan.backend_state.get());
  ASSERT_NE(state, nullptr);
  const Schedule expect =
      make_schedule(c.p, plan.qo_len, plan.kv_len, request_starts(c.p, c.args), false, 256, 132);
  ASSERT_EQ(state->schedule.work.size(), expect.work.size());
  ASSERT_GT(expect.merge_rows.size(), 0u) << "the case must split";
  const WorkspaceLayout& l = state->layout;
  EXPECT_EQ(plan.device_workspace_bytes, l.total_bytes);
  EXPECT_TRUE(rt_.owns(state->workspace, l.total_bytes));
  EXPECT_EQ(0, std::memcmp(state->at<WorkUnit>(l.work), expect.work.data(),
                           expect.work.size() * sizeof(WorkUnit)));
  EXPECT_EQ(0, std::memcmp(state->at<RequestInfo>(l.requests), expect.requests.data(),
                           expect.requests.size() * sizeof(RequestInfo)));
  EXPECT_EQ(0, std::memcmp(state->at<MergeRow>(l.merge_rows), expect.merge_rows.data(),
                           expect.merge_rows.size() * sizeof(MergeRow)));
  EXPECT_EQ(0, std::memcmp(state->at<int32_t>(l.kv_indices), c.indices.data(),
                           c.indices.size() * sizeof(int32_t)));
  // Partial states after the staged part, inside the allocation.
  EXPECT_GE(l.partial_o, l.staged_bytes);
  EXPECT_GE(l.total_bytes, l.partial_lse + std::size_t(expect.num_partial_states) * 8 * 4);
}

TEST_F(Fa2Stream, RunIssuesOnlyLaunchesOnTheCallersStream) {
  DecodeCase c;
  Plan plan;
  ASSERT_TRUE(plan_fa2(c, fa2_options(256), &plan).ok());
  const auto* state = static_cast<const PlanState*>(plan.backend_state.get());
  for (int repeat = 0; repeat < 2; ++repeat) {  // a plan is reused (every layer, graph replays)
    rt_.clear();
    const Status s = run(plan, c.args);
    ASSERT_TRUE(s.ok()) << s.message();
    int launches = 0;
    for (const Call& call : rt_.calls) {
      // Only device switching (restored below) and launches: no allocation, copy or sync.
      EXPECT_TRUE(call.name == "launch" || call.name == "get_device" || call.name == "set_device")
          << "run issued " << call.name;
      if (call.name != "launch") continue;
      ++launches;
      EXPECT_EQ(call.stream, kStream);
    }
    EXPECT_EQ(rt_.current_device, 0) << "run left the thread on device " << rt_.current_device;
    ASSERT_EQ(launches, 2);  // attention, then the split-KV merge
    const auto launch_at = [&](int k) {
      int seen = 0;
      for (const Call& call : rt_.calls)
        if (call.name == "launch" && seen++ == k) return call;
      return Call{};
    };
    const Call attention = launch_at(0), merge = launch_at(1);
    EXPECT_EQ(attention.grid.x, state->schedule.work.size());
    EXPECT_EQ(attention.block.x, unsigned(32 * decode_key_warps(128)))
        << "decode runs the decode tile: four warps splitting the keys";
    EXPECT_EQ(merge.grid.x, state->schedule.merge_rows.size());
    EXPECT_EQ(merge.grid.y, 8u) << "the merge runs a CTA per (row, query head)";
    EXPECT_EQ(merge.block.x, 32u) << "128 dims, four per thread";
    EXPECT_EQ(merge.kernel, cuda::split_merge_kernel()) << "the merge kernel fa3 launches too";
    // The kernel reads its schedule, page table and partial states from the plan's workspace.
    ASSERT_EQ(rt_.attention_params.size(), 1u);
    const AttentionParams& k = rt_.attention_params[0];
    const WorkspaceLayout& l = state->layout;
    EXPECT_EQ(static_cast<const void*>(k.work), state->at<void>(l.work));
    EXPECT_EQ(static_cast<const void*>(k.requests), state->at<void>(l.requests));
    EXPECT_EQ(static_cast<const void*>(k.kv_indices), state->at<void>(l.kv_indices));
    EXPECT_EQ(static_cast<void*>(k.partial_o), state->at<void>(l.partial_o));
    EXPECT_EQ(static_cast<void*>(k.partial_lse), state->at<void>(l.partial_lse));
    EXPECT_EQ(k.q, c.args.q.data);
    // The merge reads its rows and the partial states there too, and writes the output.
    ASSERT_EQ(rt_.merge_params.size(), 1u);
    const cuda::MergeParams& m = rt_.merge_params[0];
    EXPECT_EQ(static_cast<const void*>(m.rows), state->at<void>(l.merge_rows));
    EXPECT_EQ(m.num_rows, int64_t(state->schedule.merge_rows.size()));
    EXPECT_EQ(static_cast<const void*>(m.partial_o), state->at<void>(l.partial_o));
    EXPECT_EQ(static_cast<const void*>(m.partial_lse), state->at<void>(l.partial_lse));
    EXPECT_EQ(m.num_heads, 8);
    EXPECT_EQ(m.head_dim, 128);
    EXPECT_EQ(m.out, k.out);
  }
}

TEST_F(Fa2Stream, RunRefusesAPageTableOtherThanThePlansAndIssuesNothing) {
  DecodeCase c;
  Plan plan;
  ASSERT_TRUE(plan_fa2(c, fa2_options(0), &plan).ok());
  c.indices[5] = (c.indices[5] + 1) % 24;
  rt_.clear();
  const Status s = run(plan, c.args);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kv_indices[5]"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("plan() again"), std::string::npos) << s.message();
  for (const Call& call : rt_.calls) EXPECT_NE(call.name, "launch");
}

TEST_F(Fa2Stream, TheWorkspaceLivesAsLongAsTheLastCopyOfThePlan) {
  DecodeCase c;
  {
    Plan copy;
    {
      Plan plan;
      ASSERT_TRUE(plan_fa2(c, fa2_options(256), &plan).ok());
      EXPECT_EQ(rt_.live.size(), 1u) << "the workspace (the pinned staging is freed)";
      copy = plan;
    }
    EXPECT_EQ(rt_.live.size(), 1u);
    rt_.clear();
    EXPECT_TRUE(run(copy, c.args).ok());
  }
  EXPECT_TRUE(rt_.live.empty()) << "the workspace was not freed";
}

TEST_F(Fa2Stream, AFailedAllocationIsAnErrorThatLeaksNothing) {
  DecodeCase c;
  rt_.fail_malloc_device = 2;
  Plan plan;
  const Status s = plan_fa2(c, fa2_options(256), &plan);
  EXPECT_EQ(s.code(), ErrorCode::kInternal);
  EXPECT_NE(s.message().find("cudaMalloc: out of memory"), std::string::npos) << s.message();
  EXPECT_EQ(rt_.current_device, 0);
  EXPECT_TRUE(rt_.live.empty());
}

TEST_F(Fa2Stream, AuxOperationsUseOnlyTheirStreamAndRestoreTheDevice) {
  OpOptions o;
  o.device = Device::cuda_sm(80);
  o.device.index = 1;
  o.stream = kStream;
  std::vector<std::byte> v(4 * 2 * 64 * 4), s(4 * 2 * 4), out(v.size()), so(s.size());
  auto dev = [](void* p, DType t, std::vector<int64_t> shape) {
    TensorView x = TensorView::contiguous(p, t, shape.data(), int(shape.size()));
    x.memory = MemoryKind::kCuda;
    return x;
  };
  const TensorView va = dev(v.data(), DType::kF32, {4, 2, 64}),
                   sa = dev(s.data(), DType::kF32, {4, 2});
  const TensorView vo = dev(out.data(), DType::kF32, {4, 2, 64}),
                   sso = dev(so.data(), DType::kF32, {4, 2});
  ASSERT_TRUE(fa2_backend().merge_state(va, sa, va, sa, vo, sso, o).ok());

  // append_paged_kv_cache: the per-call page/slot array is allocated, copied and freed on the
  // stream, around the launches.
  std::vector<std::byte> k(3 * 2 * 64 * 2), cache(4 * 16 * 2 * 64);
  std::vector<int32_t> batch{0, 0, 1}, pos{0, 1, 0}, indptr{0, 1, 2}, indices{3, 1}, last{2, 1};
  PagedKVCache pc;
  pc.k_cache = dev(cache.data(), DType::kE4M3, {4, 16, 2, 64});
  pc.v_cache = pc.k_cache;
  pc.kv_indptr = TensorView::contiguous(indptr.data(), DType::kI32, {3});
  pc.kv_indices = TensorView::contiguous(indices.data(), DType::kI32, {2});
  pc.kv_last_page_len = TensorView::contiguous(last.data(), DType::kI32, {2});
  const TensorView ak = dev(k.data(), DType::kBF16, {3, 2, 64});
  ASSERT_TRUE(
      fa2_backend()
          .append_paged_kv_cache(ak, ak, TensorView::contiguous(batch.data(), DType::kI32, {3}),
                                 TensorView::contiguous(pos.data(), DType::kI32, {3}), pc, o)
          .ok());
  RopeParams rope;
  std::vector<int32_t> pos_ids{0, 5, 9};
  ASSERT_TRUE(fa2_backend()
                  .apply_rope(ak, ak, ak, ak,
                              TensorView::contiguous(pos_ids.data(), DType::kI32, {3}), rope, o)
                  .ok());

  int launches = 0;
  for (const Call& call : rt_.calls) {
    EXPECT_TRUE(call.has_stream || call.name == "get_device" || call.name == "set_device")
        << call.name << " is not stream-ordered";
    if (call.has_stream) EXPECT_EQ(call.stream, kStream) << call.name;
    launches += call.name == "launch";
  }
  EXPECT_EQ(launches, 1 + 2 + 2);
  EXPECT_EQ(rt_.current_device, 0);
  EXPECT_TRUE(rt_.live.empty()) << "scratch not freed";
}

TEST(Fa2StreamApi, ABackendWithoutStreamsRefusesOne) {
  Problem p;
  p.op = Op::kSingleDecode;
  p.num_qo_heads = p.num_kv_heads = 1;
  p.head_dim_qk = p.head_dim_vo = 64;
  std::vector<float> q(64), k(64), v(64), o(64);
  AttentionArgs a;
  a.q = TensorView::contiguous(q.data(), DType::kF32, {1, 64});
  a.k = TensorView::contiguous(k.data(), DType::kF32, {1, 1, 64});
  a.v = TensorView::contiguous(v.data(), DType::kF32, {1, 1, 64});
  a.out = TensorView::contiguous(o.data(), DType::kF32, {1, 64});
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kF32;
  PlanOptions options;
  options.backend = "cpu";
  options.stream = kStream;
  Plan plan;
  const Status s = kvattn::plan(p, a, options, &plan);
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported);
  EXPECT_NE(s.message().find("PlanOptions.stream"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cpu"), std::string::npos) << s.message();
  options.stream = nullptr;
  EXPECT_TRUE(kvattn::plan(p, a, options, &plan).ok());
}

}  // namespace
}  // namespace kvattn::fa2
