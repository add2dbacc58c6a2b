// Helpers of the SM90 emulator's tests (sm90_emulator_test.cc, sm90_async_test.cc,
// sm90_pipeline_test.cc): a run's error message, the message check, small exact operands, and a
// one-warpgroup wgmma rig over fa3's tile layout.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>

#include "core/numeric.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/emulator/sm90_emulator.h"

namespace kvattn::fa3::emu::test {

template <class Body>
std::string run_error(Sm90Cta& cta, Body&& body) {
  try {
    cta.run(std::forward<Body>(body));
  } catch (const EmulatorError& e) {
    return e.what();
  }
  return "";
}
#define EXPECT_FAILS_WITH(msg, ...)                      \
  do {                                                   \
    const std::string err_ = (msg);                      \
    for (const char* part_ : {__VA_ARGS__}) {            \
      EXPECT_NE(err_.find(part_), std::string::npos)     \
          << "missing \"" << part_ << "\" in: " << err_; \
    }                                                    \
  } while (0)

inline Sm90Launch launch(int threads, std::size_t smem) {
  Sm90Launch l;
  l.threads = threads;
  l.smem_bytes = smem;
  return l;
}

inline uint16_t bf16(float x) { return num::f32_to_bf16(x); }
// Small integers, exact in bf16 and e4m3 and in every partial sum.
inline float small_value(int a, int b, int salt) { return float((a * 7 + b * 3 + salt) % 9 - 4); }

constexpr int kM = 64, kN = 128;

// A small wgmma setup for the rule tests: one warpgroup, A and B tiles of zeros.
struct WgmmaRig {
  Sm90Cta cta{launch(128, 3 * 8192)};
  WgmmaRig() { std::memset(cta.smem(), 0, 3 * 8192); }
  static uint64_t a() { return smem::encode(smem::k_major(0, kM, 0, 0)); }
  static uint64_t b() { return smem::encode(smem::k_major(8192, kN, 0, 0)); }
  static void mma(Sm90Ops& ops, Acc<64>& d, bool acc) {
    ops.wgmma_ss(d, WgmmaType::kBf16, WgmmaType::kBf16, a(), false, b(), false, acc);
  }
};

}  // namespace kvattn::fa3::emu::test
