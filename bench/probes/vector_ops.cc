// What the decode kernels' AVX-512 instructions cost on this core, alone and two kinds side by
// side (issue 23, Zen 4 note of 2026-12-07 from 22:56 UTC): latency (one dependent chain),
// throughput (12 independent chains) and, for pairs, the cycles of 6 + 6 interleaved instructions.
// The clock is a chain of scalar adds (one cycle each on every x86 class), so the figures are core
// cycles. The pairs tell which instructions share a pipe: where two kinds issue side by side the
// pair takes the longer of the two alone; where they share one, the sum.
//
// Not part of the build (a one-off measurement, AVX512_BF16 + AVX512_VBMI CPUs):
//   g++ -O2 -march=native -std=c++20 bench/probes/vector_ops.cc -o /tmp/vo && /tmp/vo
//
// AMD EPYC Zen 4 class VM (2 vCPUs), 2026-12-08, 3.55-3.57 GHz by the scalar chain, two runs;
// cycles an instruction, throughput (latency):
//   vdpbf16ps 0.98 (5.9), vfmadd231ps 0.99 (3.9), vaddps 0.99 (3.0), vpternlogd 0.54 (1.2),
//   vpermt2b 0.99 (4.9), vpermb 0.99 (4.9), vpshufb 0.99 (2.0), vpunpcklbw 0.74 (1.3),
//   vshufi32x4 0.99 (3.9), vpslld 0.98 (1.9), vpermw 0.98 (5.0), vpmovzxbw 0.98 (3.9),
//   vcvtph2ps 1.52 (5.8).
//   Pairs: vdpbf16ps + vpunpcklbw / vpternlogd / vaddps 0.50-0.52 (side by side, two a cycle);
//   vdpbf16ps + vpermt2b 0.81-0.84, + vshufi32x4 0.79-0.84, vfmadd231ps + vpermt2b 0.83-0.88
//   (mostly one pipe); vpermt2b + vpunpcklbw 0.70-0.71.
//   So on Zen 4 the lane-crossing shuffles (vpermt2b, vshufi32x4) compete with the products and
//   the in-lane ones (unpacks), the logic and the adds do not. The FP8 decode (d128, group 4) a
//   key and KV head: 32 vdpbf16ps + 8 vpermt2b + ~4.5 lane shuffles on the products' side
//   (~40-45 cycles), the unpacks, logic and adds beside them; it takes ~63 cycles with the paced
//   prefetch's walk taken out and ~73 with it (README, Zen 4 block of 2026-12-07 from 22:56 UTC).
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <utility>

namespace {

__m512i sink[12];
long scalar_sink;

template <class F>
double ns_per_iter(F f, long iters) {
  f(1000);
  const auto t0 = std::chrono::steady_clock::now();
  f(iters);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count() * 1e9 / static_cast<double>(iters);
}

// One core cycle in ns: four dependent scalar adds an iteration.
double cycle_ns() {
  const double ns = ns_per_iter(
      [](long n) {
        long x = scalar_sink;
        for (long i = 0; i < n; ++i) {
          asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
        }
        scalar_sink = x;
      },
      200'000'000);
  return ns / 4;
}

const __m512i kA = _mm512_set1_epi16(0x3f80), kB = _mm512_set1_epi8(5);

// The instructions probed, each as x -> op(x) with constant other operands.
__m512i dpbf16(__m512i x) {
  return (__m512i)_mm512_dpbf16_ps((__m512)x, (__m512bh)kA, (__m512bh)kA);
}
__m512i fmadd(__m512i x) { return (__m512i)_mm512_fmadd_ps((__m512)x, (__m512)kA, (__m512)kA); }
__m512i addps(__m512i x) { return (__m512i)_mm512_add_ps((__m512)x, (__m512)kA); }
__m512i ternlog(__m512i x) { return _mm512_ternarylogic_epi32(x, kA, kB, 0xF8); }
__m512i permt2b(__m512i x) { return _mm512_permutex2var_epi8(kA, x, kB); }
__m512i permb(__m512i x) { return _mm512_permutexvar_epi8(x, kB); }
__m512i pshufb(__m512i x) { return _mm512_shuffle_epi8(kB, x); }
__m512i unpcklbw(__m512i x) { return _mm512_unpacklo_epi8(x, kB); }
__m512i shufi32x4(__m512i x) { return _mm512_shuffle_i32x4(x, x, 0x93); }
__m512i pslld(__m512i x) { return _mm512_slli_epi32(x, 16); }
__m512i permw(__m512i x) { return _mm512_permutexvar_epi16(x, kB); }
__m512i pmovzxbw(__m512i x) { return _mm512_cvtepu8_epi16(_mm512_castsi512_si256(x)); }
__m512i cvtph2ps(__m512i x) { return (__m512i)_mm512_cvtph_ps(_mm512_castsi512_si256(x)); }

using Op = __m512i (*)(__m512i);
struct Named {
  const char* name;
  Op op;
};
constexpr Named kOps[] = {
    {"vdpbf16ps", dpbf16},   {"vfmadd231ps", fmadd},   {"vaddps", addps},
    {"vpternlogd", ternlog}, {"vpermt2b", permt2b},    {"vpermb", permb},
    {"vpshufb", pshufb},     {"vpunpcklbw", unpcklbw}, {"vshufi32x4", shufi32x4},
    {"vpslld", pslld},       {"vpermw", permw},        {"vpmovzxbw", pmovzxbw},
    {"vcvtph2ps", cvtph2ps},
};

constexpr long kIters = 20'000'000;

template <Op kOp>
double latency_ns() {
  return ns_per_iter(
      [](long n) {
        __m512i x = sink[0];
        for (long i = 0; i < n; ++i) {
          x = kOp(x);
          asm("" : "+v"(x));
        }
        sink[0] = x;
      },
      kIters);
}

// 12 chains, the even ones taking kFirst and the odd ones kSecond: 12 instructions an iteration
// (named registers: an array's elements under the empty asm were kept in memory).
template <Op kFirst, Op kSecond>
double throughput_ns() {
  return ns_per_iter(
             [](long n) {
               __m512i x0 = sink[0], x1 = sink[1], x2 = sink[2], x3 = sink[3], x4 = sink[4],
                       x5 = sink[5], x6 = sink[6], x7 = sink[7], x8 = sink[8], x9 = sink[9],
                       x10 = sink[10], x11 = sink[11];
               for (long i = 0; i < n; ++i) {
                 x0 = kFirst(x0), x1 = kSecond(x1), x2 = kFirst(x2), x3 = kSecond(x3);
                 x4 = kFirst(x4), x5 = kSecond(x5), x6 = kFirst(x6), x7 = kSecond(x7);
                 x8 = kFirst(x8), x9 = kSecond(x9), x10 = kFirst(x10), x11 = kSecond(x11);
                 asm("" : "+v"(x0), "+v"(x1), "+v"(x2), "+v"(x3), "+v"(x4), "+v"(x5));
                 asm("" : "+v"(x6), "+v"(x7), "+v"(x8), "+v"(x9), "+v"(x10), "+v"(x11));
               }
               sink[0] = x0, sink[1] = x1, sink[2] = x2, sink[3] = x3, sink[4] = x4;
               sink[5] = x5, sink[6] = x6, sink[7] = x7, sink[8] = x8, sink[9] = x9;
               sink[10] = x10, sink[11] = x11;
             },
             kIters) /
         12;
}

template <int I>
void probe_one(double cycle) {
  constexpr Op op = kOps[I].op;
  std::printf("  %-12s throughput %.2f  latency %.2f\n", kOps[I].name,
              throughput_ns<op, op>() / cycle, latency_ns<op>() / cycle);
}

template <int... I>
void probe_all(double cycle, std::integer_sequence<int, I...>) {
  (probe_one<I>(cycle), ...);
}

template <Op kFirst, Op kSecond>
void probe_pair(const char* name, double cycle) {
  std::printf("  %-28s %.2f\n", name, throughput_ns<kFirst, kSecond>() / cycle);
}

}  // namespace

int main() {
  const double cycle = cycle_ns();
  std::printf("clock %.3f ns a cycle (%.2f GHz, scalar add chain)\n", cycle, 1 / cycle);
  std::printf("cycles an instruction (512-bit):\n");
  probe_all(cycle, std::make_integer_sequence<int, sizeof(kOps) / sizeof(kOps[0])>{});
  std::printf("pairs, cycles an instruction of 6 + 6 interleaved:\n");
  probe_pair<dpbf16, permt2b>("vdpbf16ps + vpermt2b", cycle);
  probe_pair<dpbf16, shufi32x4>("vdpbf16ps + vshufi32x4", cycle);
  probe_pair<dpbf16, unpcklbw>("vdpbf16ps + vpunpcklbw", cycle);
  probe_pair<dpbf16, ternlog>("vdpbf16ps + vpternlogd", cycle);
  probe_pair<dpbf16, addps>("vdpbf16ps + vaddps", cycle);
  probe_pair<fmadd, permt2b>("vfmadd231ps + vpermt2b", cycle);
  probe_pair<permt2b, unpcklbw>("vpermt2b + vpunpcklbw", cycle);
  return 0;
}
