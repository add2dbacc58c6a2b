// The cpu backend's kernel table (XNNPACK's manifest is the model): every kernel the backend can
// run, named by what it is (op, ISA, tile policy), with the ISA level its file is built for, the
// CPU features it needs, the rule it needs of the Problem, and its entry. The table is one list
// in preference order per op; the plan chooses from it once (choose_cpu_kernel, at plan time,
// recorded as Plan::kernel) and run() calls that entry: nothing downstream re-decides.
//
// One override, KVATTN_CPU_KERNEL=<name>|reference (ggml's use_ref): a kernel's name makes every
// problem of that kernel's op run it (an error where it does not apply: this CPU lacks its
// instructions, or the problem breaks its rule); `reference` runs every op's plain portable
// kernel. set_cpu_kernel_override does the same for tests. CPU detection (core/cpu_features.h)
// fills the table's view of the machine once.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/cpu_features.h"
#include "cpu/decode/decode.h"
#include "cpu/mla/mla.h"
#include "cpu/prefill/params.h"
#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::cpu {

enum class KernelOp { kDecode, kPrefill, kMla };
std::string_view kernel_op_name(KernelOp op);
KernelOp kernel_op_of(const Problem& problem);

struct CpuKernel {
  std::string_view name;  // "<op>-<isa>-<policy>", e.g. "decode-avx2-fma-k32"
  KernelOp op;
  CpuIsa isa;  // the ISA level of the file that holds it (its compile flags)
  // The CPU features it needs beyond its level (AVX512_BF16, VBMI, AMX): Ok if `cpu` has them,
  // else which one is missing.
  Status (*runs_on)(const detail::CpuFeatures& cpu);
  // The rule it needs of the problem: Ok where it computes this problem, else the rule broken.
  Status (*applies)(const Problem& problem);
  // Chosen by default where it runs and applies (false: only when named by the override, e.g.
  // the bf16 dot-product kernels on CPUs where vdpbf16ps is slow, or by the plan as another's
  // `taller`). nullptr: always.
  bool (*preferred)(const detail::CpuFeatures& cpu);
  // The entry, one per op (the others null).
  DecodeItemFn (*decode)(const Problem& problem, int group_padded) = nullptr;
  prefill::PrefillItemFn (*prefill)() = nullptr;
  MlaItemFn (*mla)(const MlaParams& params) = nullptr;
  // The vector kernels read unit-stride rows: on views whose head dim is strided, run() takes
  // this kernel of the same op instead ("": this one takes any stride).
  std::string_view strided;
  // Prefill: the tile policy (the rNkM of the name) the plan cuts its work items with.
  prefill::TilePolicy tile{};
  // Prefill: the same code with twice the query rows a tile (the next rNkM up), which the plan
  // takes in this one's place where the requests' lengths leave work enough for every thread
  // and its scratch stays within L2 (plan_prefill, prefill_kernel_for_lengths); "": none.
  std::string_view taller{};
};

// Every kernel built into this library, each op's in preference order (the portable one last).
std::span<const CpuKernel> cpu_kernels();
const CpuKernel* find_cpu_kernel(std::string_view name);
// The op's portable kernel (any dtype, stride and CPU): what `reference` forces.
const CpuKernel& portable_cpu_kernel(KernelOp op);
// What `k` runs on strided rows (kernel_table.h, CpuKernel::strided): `k` or its fallback.
const CpuKernel& strided_cpu_kernel(const CpuKernel& k);
// Ok where `k` runs on a CPU with `cpu` at ISA level `isa`.
Status kernel_runs_on(const CpuKernel& k, CpuIsa isa, const detail::CpuFeatures& cpu);

// The plan-time choice for `problem` at ISA level `isa` on a CPU with `cpu` (this machine's
// detection by default; tests describe others): the override's kernel where one is set (an
// error naming it and the rule where it does not apply), else the op's first kernel that runs
// there, applies and is preferred.
Status choose_cpu_kernel(const Problem& problem, CpuIsa isa, const CpuKernel** out);
Status choose_cpu_kernel(const Problem& problem, CpuIsa isa, const detail::CpuFeatures& cpu,
                         const CpuKernel** out);
// The ISA level plans use on `device`: its level, never above what this CPU allows.
CpuIsa plan_isa(const Device& device);
// Whether the override (KVATTN_CPU_KERNEL or set_cpu_kernel_override) decides `op`'s kernel: it
// names a kernel of that op, or `reference`. The plan then runs exactly that kernel (no taller
// tiles in its place).
bool cpu_kernel_forced(KernelOp op);
// `k`'s taller tiles (CpuKernel::taller), shortest first.
std::vector<const CpuKernel*> taller_cpu_kernels(const CpuKernel& k);
// Tests: as KVATTN_CPU_KERNEL (a name, "reference", or "" for none), in place of the
// environment until cleared. `only_where_it_applies`: a problem the named kernel does not
// compute takes the default choice instead of an error (a test running its grid on one kernel).
void set_cpu_kernel_override(std::string_view name, bool only_where_it_applies = false);
void clear_cpu_kernel_override();

// The kernel a plan recorded (Plan::kernel), for run(); an internal error where it is not in
// the table (a plan of another build).
Status planned_cpu_kernel(const std::string& name, KernelOp op, const CpuKernel** out);

}  // namespace kvattn::cpu
