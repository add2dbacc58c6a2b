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

// exp2 (flushed to 0 below 2^-125 as at every level), tanh, round_f16 and the basic operations:
// the scalar helpers the decode kernels use too (simd_scalar.h), written once; fma stays a
// multiply-add (std::fma is a library call without the FMA instruction, baseline x86-64's case).
struct Vec : ::kvattn::cpu::scalar::Simd {
  using Reg = float;
  static constexpr int W = 1;
  static constexpr int kRowVecs = 4;
  static constexpr int kKeyBlock = 4;
  static constexpr int kDvBlock = 4;

  static Reg fma(Reg a, Reg b, Reg c) { return a * b + c; }
  static Reg exp2_probability(Reg x) { return exp2(x); }  // no cheaper form here
  static bool any_greater(Reg a, Reg b) { return a > b; }
  static Reg zero_if_neg_inf(Reg x) { return x == -HUGE_VALF ? 0.0f : x; }
  static void transpose(Reg*) {}  // 1 x 1
};

#include "cpu/prefill/kernel.h"

}  // namespace
}  // namespace kvattn::cpu::prefill::scalar

namespace kvattn::cpu::prefill {
PrefillItemFn prefill_item_fn_scalar() { return &scalar::run_item; }
}  // namespace kvattn::cpu::prefill
