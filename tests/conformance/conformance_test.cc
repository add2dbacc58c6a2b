// The cross-backend conformance suite (ggml's test-backend-ops is the model): every registered
// backend (backend_names(), but the reference, which is what the others are compared with) on
// one grid of operation x dtypes x KV layout x attention variant (testing/variants.h) x lengths
// below, at, above and at multiples of the page and tile sizes, against the fp64 reference with
// the precision-following tolerance of testing/tolerance.h. A backend that is not available here
// (no CUDA device, its kernel not in this build) or whose can_implement refuses a case skips
// that case with the reason.
//
// Each test runs one of the length sets (they take turns along the variants), so CI stays small;
// KVATTN_CONFORMANCE_FULL=1 runs every length set in every test.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/selection.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"
#include "testing/variants.h"

#if KVATTN_CONFORMANCE_CUDA
#include "cuda/gpu/device_mirror.h"
#endif

namespace kvattn::conformance {
namespace {

using testing::CaseSpec;

// The query, KV and output dtypes of a case: 16-bit and f32 throughout, an FP8 cache under
// 16-bit queries (an engine's FP8 KV cache), and FP8 queries over an FP8 cache (fa3's FP8 path).
struct DTypes {
  const char* name;
  DType q, kv, o;
};
constexpr DTypes kDTypes[] = {
    {"bf16", DType::kBF16, DType::kBF16, DType::kBF16},
    {"f16", DType::kF16, DType::kF16, DType::kF16},
    {"f32", DType::kF32, DType::kF32, DType::kF32},
    {"bf16_e4m3", DType::kBF16, DType::kE4M3, DType::kBF16},
    {"f16_e5m2", DType::kF16, DType::kE5M2, DType::kF16},
    {"e4m3", DType::kE4M3, DType::kE4M3, DType::kBF16},
};

// Lengths of the four requests of a batch op (a single op takes the last one; decode has one
// query per request) around the sizes the backends tile by: 16-token pages; the cpu decode tile
// of 32 keys and its prefill query tiles of 16 to 64 rows; fa2's and fa3's KV blocks of 64 and
// 128 keys and query tiles of 64 and 128 rows.
constexpr int kPageSize = 16;
struct Lengths {
  const char* name;
  int64_t qo[4], kv[4];
};
constexpr Lengths kLengths[] = {
    // Around one page; request 0 has more queries than keys, so its first causal rows see none.
    {"page", {17, 16, 1, 15}, {15, 16, 17, 32}},
    {"tiles_32_64", {31, 1, 64, 65}, {31, 33, 64, 65}},
    {"tiles_128", {127, 128, 2, 129}, {127, 128, 129, 256}},
};

constexpr Op kOps[] = {Op::kBatchDecode, Op::kSingleDecode, Op::kBatchPrefillPaged,
                       Op::kBatchPrefillRagged, Op::kSinglePrefill};

// One test of the grid. `lengths` is the set CI runs (all of them under KVATTN_CONFORMANCE_FULL).
struct GridPoint {
  std::string backend;
  Op op;
  int dtypes;
  KVLayout layout;
  int variant;
  int lengths;
};

// The FP8 scales an engine keeps beside an FP8 cache and an FP8 query (they fold into the
// kernel); the one place the suite sets them.
void scale_fp8(CaseSpec& s) {
  const Problem& p = s.problem;
  if (is_fp8(p.q_dtype)) s.scalars.q_scale = 0.25f;
  if (is_fp8(p.kv_dtype)) {
    s.scalars.k_scale = 0.5f;
    s.scalars.v_scale = 2.0f;
  }
}

CaseSpec make_spec(const GridPoint& g, const Lengths& len, uint64_t seed) {
  CaseSpec s;
  s.seed = seed;
  Problem& p = s.problem;
  p.op = g.op;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim_qk = p.head_dim_vo = 128;
  p.q_dtype = kDTypes[g.dtypes].q;
  p.kv_dtype = kDTypes[g.dtypes].kv;
  p.o_dtype = kDTypes[g.dtypes].o;
  p.page_size = kPageSize;
  p.kv_layout = g.layout;
  if (is_batch(g.op)) {
    p.batch_size = 4;
    s.kv_lens.assign(len.kv, len.kv + 4);
    if (!is_decode(g.op)) s.qo_lens.assign(len.qo, len.qo + 4);
  } else {
    p.batch_size = 1;
    s.kv_lens = {len.kv[3]};
    if (!is_decode(g.op)) s.qo_lens = {len.qo[3]};
  }
  scale_fp8(s);
  testing::attention_variants()[g.variant].apply(s);
  return s;
}

// Ragged K/V has one layout (token-major); the other ops take both.
bool op_has_layouts(Op op) { return op != Op::kBatchPrefillRagged; }

std::vector<GridPoint> grid() {
  std::vector<GridPoint> points;
  const auto variants = testing::attention_variants();
  for (const std::string& backend : backend_names()) {
    if (backend == "reference") continue;
    for (Op op : kOps) {
      for (int d = 0; d < int(std::size(kDTypes)); ++d) {
        for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
          if (layout == KVLayout::kHND && !op_has_layouts(op)) continue;
          for (int v = 0; v < int(variants.size()); ++v) {
            GridPoint g{backend, op, d, layout, v, 0};
            g.lengths = int((v + d + int(layout)) % std::size(kLengths));
            // A variant that means nothing for these dtypes (FP8 scale granularities on a 16-bit
            // cache) is not a point of the grid.
            if (!testing::variant_applies(variants[v], make_spec(g, kLengths[0], 0).problem)) {
              continue;
            }
            points.push_back(g);
          }
        }
      }
    }
  }
  return points;
}

std::string point_string(const GridPoint& g) {
  return g.backend + "_" + std::string(op_name(g.op)) + "_" + kDTypes[g.dtypes].name + "_" +
         std::string(kv_layout_name(g.layout)) + "_" +
         testing::attention_variants()[g.variant].name;
}
std::string point_name(const ::testing::TestParamInfo<GridPoint>& info) {
  return point_string(info.param);
}
void PrintTo(const GridPoint& g, std::ostream* os) {
  *os << point_string(g) << " (lengths " << kLengths[g.lengths].name << ")";
}

// Where a backend runs on this machine: the CPU for a backend available there, else the first
// CUDA device; nullopt with why when there is none.
std::optional<Device> device_for(const std::string& backend, std::string* why) {
  static std::map<std::string, std::pair<std::optional<Device>, std::string>> cache;
  auto it = cache.find(backend);
  if (it == cache.end()) {
    std::optional<Device> device;
    std::string reason;
    Problem plain;
    for (const Verdict& v : explain(plain, Device::cpu()).verdicts) {
      if (v.backend == backend && v.available) device = Device::cpu();
    }
    if (!device) {
      const MachineDevices machine = query_devices();
      if (machine.cuda.empty()) {
        const std::string& status = machine.cuda_status;
        reason =
            status.rfind("no CUDA device", 0) == 0 ? status : "no CUDA device (" + status + ")";
      } else {
        device = Device::parse("cuda", &reason);  // the first present GPU
      }
    }
    it = cache.emplace(backend, std::make_pair(device, reason)).first;
  }
  *why = it->second.second;
  return it->second.first;
}

testing::RunBackend runner(const std::string& backend, const Device& device) {
  if (device.is_cpu()) return testing::run_with_backend(backend);
#if KVATTN_CONFORMANCE_CUDA
  return fa2::test::run_backend(backend, device);
#else
  return [](const Problem&, const AttentionArgs&) {
    return Status(ErrorCode::kUnavailable, "CUDA support not built");
  };
#endif
}

bool full_grid() {
  const char* env = std::getenv("KVATTN_CONFORMANCE_FULL");
  return env != nullptr && std::string(env) == "1";
}

class Conformance : public ::testing::TestWithParam<GridPoint> {};

TEST_P(Conformance, MatchesTheReference) {
  const GridPoint& g = GetParam();
  std::string why;
  const std::optional<Device> device = device_for(g.backend, &why);
  if (!device) GTEST_SKIP() << g.backend << ": " << why;
  std::vector<int> sets = {g.lengths};
  if (full_grid()) sets = {0, 1, 2};
  for (int set : sets) {
    const uint64_t seed = 1 + uint64_t(set) + 7 * uint64_t(g.variant) + 131 * uint64_t(g.dtypes);
    const CaseSpec spec = make_spec(g, kLengths[set], seed);
    for (const Verdict& v : explain(spec.problem, *device).verdicts) {
      if (v.backend != g.backend) continue;
      if (!v.supported) GTEST_SKIP() << v.reason;
      if (!v.available) GTEST_SKIP() << v.availability;
    }
    testing::Case c = testing::Case::make(spec);
    const testing::CheckResult r = testing::check_against_reference(c, runner(g.backend, *device));
    EXPECT_TRUE(r.ok) << g.backend << " on " << device->to_string() << ", lengths "
                      << kLengths[set].name << ": " << spec.problem.to_string() << "\n"
                      << r.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, Conformance, ::testing::ValuesIn(grid()), point_name);

}  // namespace
}  // namespace kvattn::conformance
