// The constants of the softmax's change of base, named once: scores kept in the log2 domain
// (exp2 the only transcendental) are multiplied by kLog2e, and an LSE in base 2 is turned into
// the natural-log one by kLn2. Host and device; the f64 ones for host-side tables.
#pragma once

namespace kvattn::math {

inline constexpr float kLog2e = 1.44269504088896341f;   // log2(e)
inline constexpr float kLn2 = 0.693147180559945309f;    // ln(2) = 1 / log2(e)
inline constexpr double kLog2eF64 = 1.4426950408889634;
inline constexpr double kLn2F64 = 0.6931471805599453;

}  // namespace kvattn::math
