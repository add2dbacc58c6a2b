// The portable prefill kernel: one f32 lane, plain C++ (built without ISA flags), the fallback
// and the path KVATTN_CPU_KERNEL=reference forces for debugging.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/element_io.h"
#include "cpu/common/simd_scalar.h"
#include "cpu/prefill/params.h"

namespace kvattn::cpu::prefill::scalar {
namespace {

struct Vec {
  using Reg = float;
  static constexpr int W = 1;
  static constexpr int kRowVecs = 4;
  static constexpr int kKeyBlock = 4;
  static constexpr int kDvBlock = 4;

  static Reg zero() { return 0.0f; }
  static Reg load(const float* p) { return *p; }
  static void store(float* p, Reg x) { *p = x; }
  static Reg set1(float x) { return x; }
  static Reg fma(Reg a, Reg b, Reg c) { return a * b + c; }
  static Reg mul(Reg a, Reg b) { return a * b; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static Reg sub(Reg a, Reg b) { return a - b; }
  static Reg max(Reg a, Reg b) { return a > b ? a : b; }
  static bool any_greater(Reg a, Reg b) { return a > b; }
  static Reg zero_if_neg_inf(Reg x) { return x == -HUGE_VALF ? 0.0f : x; }
  // exp2 (flushed to 0 below 2^-125 as at every level), tanh and round_f16: the scalar
  // helpers the decode kernels use too (simd_scalar.h), written once.
  static Reg exp2(Reg x) { return ::kvattn::cpu::scalar::Simd::exp2(x); }
  static Reg tanh(Reg x) { return ::kvattn::cpu::scalar::Simd::tanh(x); }
  static Reg round_f16(Reg x) { return ::kvattn::cpu::scalar::Simd::round_f16(x); }

  static void load_convert(const void* src, DType dtype, int n, float scale, float* dst) {
    for (int i = 0; i < n; ++i) dst[i] = io::load_f32(src, dtype, i) * scale;
  }
  static void store_convert(const float* src, int n, DType dtype, void* dst) {
    for (int i = 0; i < n; ++i) io::store_f32(dst, dtype, i, src[i]);
  }
};

#include "cpu/prefill/kernel.h"

}  // namespace
}  // namespace kvattn::cpu::prefill::scalar

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_scalar() { return &scalar::run_item; }
}  // namespace kvattn::cpu::prefill
