// A layer's run with its own scales reuses the plan as it is: no copy of the plan, no allocation
// beyond what a run with unchanged values makes (issue 24). Every operator new of this executable
// is counted here, so the test is its own executable.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "kvattn/attention.h"
#include "testing/case_builder.h"

namespace {
std::atomic<long> g_allocations{0};

void* counted(std::size_t n, std::size_t align) {
  ++g_allocations;
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n ? n : 1)
                : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new[](std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace kvattn {
namespace {

// Allocations made while `fn` runs.
template <class Fn>
long allocations_of(Fn&& fn) {
  const long before = g_allocations.load();
  fn();
  return g_allocations.load() - before;
}

TEST(RunAllocations, NewScalesPerLayerAllocateNothingMoreAndCopyNoPlan) {
  for (const char* backend : {"cpu", "reference"}) {
    for (DType kv : {DType::kE4M3, DType::kBF16}) {
      SCOPED_TRACE(std::string(backend) + ", kv " + std::string(dtype_name(kv)));
      testing::CaseSpec spec;
      Problem& p = spec.problem;
      p.op = Op::kBatchDecode;
      p.batch_size = 4;
      p.num_qo_heads = 8;
      p.num_kv_heads = 2;
      p.head_dim_qk = p.head_dim_vo = 128;
      p.kv_dtype = kv;
      spec.kv_lens = {33, 200, 1, 64};
      spec.return_lse = true;
      testing::Case c = testing::Case::make(spec);
      AttentionArgs args = c.args();
      PlanOptions options;
      options.backend = backend;
      options.num_threads = 1;  // a deterministic count: no pool scheduling in the way
      Plan plan;
      ASSERT_TRUE(kvattn::plan(p, args, options, &plan).ok());
      std::vector<std::byte> workspace(plan.workspace_bytes);
      auto run_layer = [&] {
        ASSERT_TRUE(run(plan, args, workspace.data(), workspace.size()).ok());
      };
      run_layer();  // warm-up: first-use state (thread pool, tables)

      // The counter sees what a per-layer plan copy (what Python's per-scale plan variants did)
      // would cost: were run to copy the plan, the counts below would grow by at least this.
      const long copy = allocations_of([&] {
        Plan copied = plan;
        (void)copied;
      });
      EXPECT_GT(copy, 0);

      const long unchanged = allocations_of(run_layer);
      const WorkItem* work = plan.work.data();
      for (int layer = 0; layer < 16; ++layer) {
        args.scalars.q_scale = 0.5f + 0.125f * layer;
        args.scalars.k_scale = 0.25f + 0.0625f * layer;
        args.scalars.v_scale = 2.0f - 0.0625f * layer;
        args.scalars.lse_base = layer % 2 ? LseBase::k2 : LseBase::kE;
        EXPECT_EQ(allocations_of(run_layer), unchanged) << "layer " << layer;
      }
      EXPECT_EQ(plan.work.data(), work) << "the plan was rebuilt";
      std::printf("[ %s, kv %s ] allocations per run: %ld (a plan copy: %ld)\n", backend,
                  std::string(dtype_name(kv)).c_str(), unchanged, copy);
    }
  }
}

}  // namespace
}  // namespace kvattn
