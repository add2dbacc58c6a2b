#include "core/cpu_features.h"

#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvattn::detail {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
#if defined(__clang__)
  // clang 14 (Debian's, used for fuzzing and TSan) has no "f16c" / "avx512fp16" in
  // __builtin_cpu_supports: read them from CPUID (leaf 1 ECX bit 29, leaf 7 EDX bit 23).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) f.f16c = (ecx >> 29) & 1;
#else
  f.f16c = __builtin_cpu_supports("f16c");
#endif
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  {
    // CPUID leaf 7 ECX bit 1 (vpermb / vpermi2b), read directly for every compiler.
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) f.avx512_vbmi = (c >> 1) & 1;
  }
#if defined(__clang__)
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) f.avx512_fp16 = (edx >> 23) & 1;
#elif defined(__GNUC__) && __GNUC__ >= 12
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  f.avx512_fp16 = __builtin_cpu_supports("avx512fp16");
#endif
#endif
  {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool amd = __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u &&
                     c == 0x444d4163u;  // "AuthenticAMD"
    f.fast_bf16_dot = f.avx512_bf16 && amd;
    f.amd = amd;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
      f.family = x86_family(a);
      f.model = x86_model(a);
    }
    f.decode_prefetch = decode_prefetch_for(amd, f.family, f.model);
    f.decode_fma_head_steps = decode_fma_head_steps_for(amd, f.family, f.model);
    f.decode_lane_head_steps = decode_lane_head_steps_for(amd, f.family);
  }
#if defined(__x86_64__) && defined(__linux__)
  {
    // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE (clang 14's __builtin_cpu_supports does
    // not know the AMX names); then the OS's grant of the tile data state.
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1) && ((d >> 24) & 1)) {
      constexpr long kArchReqXcompPerm = 0x1023;
      constexpr long kXfeatureXtiledata = 18;
      f.amx_bf16 = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
    }
  }
#endif
  if (f.avx2 && f.fma && f.f16c) f.best = CpuIsa::kAvx2;
  if (f.best == CpuIsa::kAvx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) {
    f.best = CpuIsa::kAvx512;
  }
  return f;
}

constexpr int kNoLimit = -1;
std::atomic<int> g_isa_limit{kNoLimit};

}  // namespace

int x86_family(unsigned leaf1_eax) {
  const unsigned base = (leaf1_eax >> 8) & 0xf, extended = (leaf1_eax >> 20) & 0xff;
  return int(base == 0xf ? base + extended : base);
}

int x86_model(unsigned leaf1_eax) {
  const unsigned base_family = (leaf1_eax >> 8) & 0xf;
  const unsigned model = (leaf1_eax >> 4) & 0xf, extended = (leaf1_eax >> 16) & 0xf;
  return int(base_family == 0x6 || base_family == 0xf ? (extended << 4) | model : model);
}

bool amd_zen3(bool amd, int family, int model) {
  return amd && family == 0x19 && (model < 0x10 || (model >= 0x20 && model < 0x60));
}

DecodePrefetch decode_prefetch_for(bool amd, int family, int model) {
  // AMD into L1 since issue 23's Zen 4 pass of 2026-12-05 (token rows before Zen 5 until then),
  // but Zen 3 into L2 since its pass of 2026-12-07 (CpuFeatures::decode_prefetch).
  if (!amd || amd_zen3(amd, family, model)) return {PrefetchHint::kL2};
  return {PrefetchHint::kL1};
}

bool decode_fma_head_steps_for(bool amd, int family, int model) {
  return amd && (family >= 0x1a || amd_zen3(amd, family, model));
}

bool decode_lane_head_steps_for(bool amd, int family) { return !amd || family >= 0x1a; }

std::string CpuFeatures::to_string() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_fp16, "avx512_fp16");
  add(avx512_vbmi, "avx512_vbmi");
  add(fast_bf16_dot, "fast_bf16_dot");
  add(amd, "amd");
  add(decode_prefetch.hint == PrefetchHint::kL1, "decode_prefetch_l1");
  add(decode_fma_head_steps, "decode_fma_head_steps");
  add(decode_lane_head_steps, "decode_lane_head_steps");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "none" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

CpuIsa effective_cpu_isa() {
  CpuIsa isa = cpu_features().best;
  int limit = g_isa_limit.load();
  if (limit != kNoLimit && static_cast<CpuIsa>(limit) < isa) isa = static_cast<CpuIsa>(limit);
  return isa;
}

void set_cpu_isa_limit(CpuIsa isa) { g_isa_limit.store(static_cast<int>(isa)); }
void clear_cpu_isa_limit() { g_isa_limit.store(kNoLimit); }

}  // namespace kvattn::detail
