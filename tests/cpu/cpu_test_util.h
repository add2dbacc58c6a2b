// Shared helpers of the cpu backend tests: the ISA levels this machine has, and a cross-check of
// the cpu backend against the reference at one level.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/cpu_features.h"
#include "cpu/kernel_table.h"
#include "kvattn/attention.h"
#include "kvattn/device.h"
#include "testing/case_builder.h"
#include "testing/tolerance.h"

namespace kvattn::cputest {

// Every level up to the best this machine allows, lowest first.
inline std::vector<CpuIsa> isa_levels() {
  std::vector<CpuIsa> levels;
  detail::clear_cpu_isa_limit();
  const CpuIsa best = detail::effective_cpu_isa();
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa <= best) levels.push_back(isa);
  }
  return levels;
}

// Lowers the kernels' ISA for the lifetime of the object.
class IsaLimit {
 public:
  explicit IsaLimit(CpuIsa isa) { detail::set_cpu_isa_limit(isa); }
  ~IsaLimit() { detail::clear_cpu_isa_limit(); }
  IsaLimit(const IsaLimit&) = delete;
  IsaLimit& operator=(const IsaLimit&) = delete;
};

// Names a kernel of the table (kernel_table.h) for the lifetime of the object; a problem it does
// not compute takes the default choice (the grids mix problems).
class KernelOverride {
 public:
  explicit KernelOverride(std::string_view name) { cpu::set_cpu_kernel_override(name, true); }
  ~KernelOverride() { cpu::clear_cpu_kernel_override(); }
  KernelOverride(const KernelOverride&) = delete;
  KernelOverride& operator=(const KernelOverride&) = delete;
};

// An environment variable set for a scope (the cpu backend reads KVATTN_CPU_* at every plan).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// The kernels of `op` this machine runs, in table order.
inline std::vector<const cpu::CpuKernel*> runnable_kernels(cpu::KernelOp op) {
  std::vector<const cpu::CpuKernel*> out;
  for (const cpu::CpuKernel& k : cpu::cpu_kernels()) {
    if (k.op == op &&
        cpu::kernel_runs_on(k, detail::cpu_features().best, detail::cpu_features()).ok()) {
      out.push_back(&k);
    }
  }
  return out;
}

struct CpuRunOptions {
  int num_threads = 0;
  int64_t kv_chunk_size = 0;
};

inline testing::RunBackend run_cpu(CpuRunOptions o = {}) {
  return [o](const Problem& problem, const AttentionArgs& args) {
    PlanOptions options;
    options.backend = "cpu";
    options.num_threads = o.num_threads;
    options.kv_chunk_size = o.kv_chunk_size;
    return kvattn::run(problem, args, options);
  };
}

// Builds the case, runs cpu at `isa` and checks it against the reference.
inline void expect_matches_reference(const testing::CaseSpec& spec, CpuIsa isa,
                                     CpuRunOptions o = {}) {
  IsaLimit limit(isa);
  testing::Case c = testing::Case::make(spec);
  const testing::CheckResult r = testing::check_against_reference(c, run_cpu(o));
  EXPECT_TRUE(r.ok) << "isa " << cpu_isa_name(isa) << ", chunk " << o.kv_chunk_size << ": "
                    << spec.problem.to_string() << "\n"
                    << r.message;
}

// A copy of a contiguous [a, b, c] tensor of `dtype` whose last dim has stride 2 (the gaps hold
// garbage), and its view.
struct StridedCopy {
  std::vector<std::byte> bytes;
  TensorView view;
};
inline StridedCopy strided_copy(const TensorView& t) {
  const std::size_t esize = dtype_size(t.dtype);
  StridedCopy s;
  s.bytes.assign(static_cast<std::size_t>(t.numel()) * 2 * esize, std::byte{0x7b});
  for (int64_t e = 0; e < t.numel(); ++e) {
    std::memcpy(s.bytes.data() + 2 * e * esize, static_cast<const std::byte*>(t.data) + e * esize,
                esize);
  }
  s.view = TensorView::strided(s.bytes.data(), t.dtype, {t.shape[0], t.shape[1], t.shape[2]},
                               {2 * t.shape[1] * t.shape[2], 2 * t.shape[2], 2});
  return s;
}

}  // namespace kvattn::cputest
