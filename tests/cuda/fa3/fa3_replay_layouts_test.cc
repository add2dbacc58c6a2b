// fa3 runs what it can_implement, whatever the tensors' strides (issue 21 item 4): q, K and V
// whose head dim is strided or whose rows are not 16-byte aligned are gathered byte by byte by
// the kernel (prefill_cta.h's gather16; TMA and cp.async only take rows of 16-byte chunks), and
// out with a strided head dim is stored element by element. can_implement sees no tensor, so
// `auto` picks fa3 for such a problem on SM90 (prefill), and fa3's run must then not refuse it:
// each case below asks explain which backend runs the problem, then replays fa3's kernel body
// (fa3_replay.h) on copies of the case's tensors in the odd layout and compares with the fp64
// reference.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/common/case_spec.h"
#include "cuda/fa3/kernel_key.h"
#include "cuda/fa3/fa3_emu_ops.h"
#include "cuda/fa3/fa3_replay.h"
#include "kvattn/selection.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::fa3 {
namespace {

// How a tensor is laid out again: every dim row-major, the head dim `dim_stride` elements apart,
// the base `offset_bytes` past a 64-byte aligned allocation.
struct Layout {
  int64_t dim_stride = 1;
  int64_t offset_bytes = 0;
};

// A copy of `t` in layout `l` (its values, element by element), owning its storage.
struct Restrided {
  std::unique_ptr<std::byte[]> storage;
  TensorView view;
};
int64_t offset_of(const TensorView& t, const int64_t* idx) {
  int64_t off = 0;
  for (int d = 0; d < t.rank; ++d) off += idx[d] * t.strides[size_t(d)];
  return off;
}
template <class F>
void for_each_index(const TensorView& t, F&& f) {
  int64_t idx[kMaxRank] = {};
  if (t.numel() == 0) return;
  for (;;) {
    f(idx);
    int d = t.rank - 1;
    while (d >= 0 && ++idx[d] == t.shape[size_t(d)]) idx[d--] = 0;
    if (d < 0) return;
  }
}
Restrided restride(const TensorView& t, Layout l) {
  Restrided r;
  r.view = t;
  int64_t stride = l.dim_stride;
  for (int d = t.rank - 1; d >= 0; --d) {
    r.view.strides[size_t(d)] = stride;
    stride *= t.shape[size_t(d)];
  }
  const int64_t elem = int64_t(dtype_size(t.dtype));
  const int64_t bytes = r.view.extent_elements() * elem;
  r.storage.reset(new std::byte[size_t(bytes + l.offset_bytes + 64)]);
  std::byte* base = r.storage.get();
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  r.view.data = base + l.offset_bytes;
  r.view.buffer_bytes = bytes;
  std::memset(r.view.data, 0xff, size_t(bytes));  // the gaps between elements: NaN-ish garbage
  for_each_index(t, [&](const int64_t* idx) {
    std::memcpy(static_cast<std::byte*>(r.view.data) + offset_of(r.view, idx) * elem,
                static_cast<const std::byte*>(t.data) + offset_of(t, idx) * elem, size_t(elem));
  });
  return r;
}
void copy_back(const Restrided& from, const TensorView& to) {
  const int64_t elem = int64_t(dtype_size(to.dtype));
  for_each_index(to, [&](const int64_t* idx) {
    std::memcpy(static_cast<std::byte*>(to.data) + offset_of(to, idx) * elem,
                static_cast<const std::byte*>(from.view.data) + offset_of(from.view, idx) * elem,
                size_t(elem));
  });
}

struct Layouts {
  Layout q, k, v, out;
  std::string name;
};

// Replays fa3 with q / K / V / out copied into the layouts (the case's own out receives the
// result back, so the reference comparison is the usual one).
testing::RunBackend run_in_layouts(const Layouts& l) {
  return [l](const Problem& p, const AttentionArgs& args) -> Status {
    AttentionArgs a = args;
    const bool paged = is_paged(p.op);
    Restrided q = restride(args.q, l.q);
    Restrided k = restride(paged ? args.paged_k_cache : args.k, l.k);
    Restrided v = restride(paged ? args.paged_v_cache : args.v, l.v);
    Restrided out = restride(args.out, l.out);
    a.q = q.view;
    (paged ? a.paged_k_cache : a.k) = k.view;
    (paged ? a.paged_v_cache : a.v) = v.view;
    a.out = out.view;
    ReplayOptions o;
    o.kv_chunk_size = 128;  // the split merge writes out too
    const Status st = run_replay(o)(p, a);
    if (st.ok()) copy_back(out, args.out);
    return st;
  };
}

const Device kSm90 = Device::parse("cuda:sm90").value();

TEST(Fa3ReplayLayouts, StridedAndMisalignedTensorsRunWhereAutoPicksFa3) {
  const KernelKey keys[] = {{DType::kBF16, DType::kBF16, 128, 128},
                            {DType::kE4M3, DType::kE4M3, 128, 128}};
  const Layouts layouts[] = {
      {{2, 0}, {}, {}, {}, "q with head dim stride 2"},
      {{1, 16 + 2}, {}, {}, {}, "q rows 2 bytes past 16-byte alignment"},
      {{}, {3, 0}, {1, 4}, {}, "K head dim stride 3, V rows 4 bytes off"},
      {{}, {1, 1}, {2, 1}, {}, "K and V rows one byte off, V head dim stride 2"},
      {{}, {}, {}, {2, 0}, "out with head dim stride 2"},
      {{3, 1}, {2, 2}, {2, 6}, {3, 4}, "everything strided and off"},
  };
  for (const KernelKey& key : keys) {
    for (Op op : {Op::kBatchPrefillRagged, Op::kBatchPrefillPaged, Op::kBatchDecode}) {
      testing::CaseSpec spec = cuda::kernel_case_spec(key, op, {70, 9}, {70, 200}, 4, 2);
      spec.problem.mask_mode = is_decode(op) ? MaskMode::kNone : MaskMode::kCausal;
      // What selection says of this problem on an SM90: prefill goes to fa3 (auto), decode to
      // fa2 by priority, with fa3 able to run it when asked.
      const Explanation e = explain(spec.problem, kSm90);
      if (!is_decode(op)) {
        ASSERT_TRUE(e.selected.has_value());
        EXPECT_EQ(*e.selected, "fa3") << e.to_text();
      }
      bool fa3_ok = false;
      for (const Verdict& v : e.verdicts) fa3_ok = fa3_ok || (v.backend == "fa3" && v.supported);
      ASSERT_TRUE(fa3_ok) << e.to_text();
      for (const Layouts& l : layouts) {
        emu::ReplayCounters& n = emu::replay_counters();
        n.reset();
        testing::Case c = testing::Case::make(spec);
        const testing::CheckResult r = testing::check_against_reference(c, run_in_layouts(l));
        const std::string what =
            kernel_key_string(key) + " " + std::string(op_name(op)) + ", " + l.name;
        EXPECT_TRUE(r.ok) << what << ": " << r.message;
        if (l.q.dim_stride == 1 && l.q.offset_bytes % 16 == 0) continue;
        // Q rows not in 16-byte chunks are gathered by the producer's Q warp (prefill_cta.h's
        // copy_q) and stored by its lanes: every Q row of every tile once, no cp.async into a
        // Q tile, and no global load by a consumer.
        const int64_t row_bytes = key.head_dim_qk * (is_fp8(key.q) ? 1 : 2);
        EXPECT_EQ(n.q_tile_stored_bytes[0], n.q_rows * row_bytes) << what;
        EXPECT_EQ(n.q_tile_async_bytes[0], 0) << what;
        for (int wg : {1, 2}) {
          EXPECT_EQ(n.global_load_bytes[wg], 0) << what << ": consumer warpgroup " << wg;
          EXPECT_EQ(n.q_tile_async_bytes[wg], 0) << what << ": consumer warpgroup " << wg;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvattn::fa3
