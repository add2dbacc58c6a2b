// What the decode's bf16-dot QK of 4 query rows costs a key on this core (issue 23, Zen 4 note of
// 2026-12-03 evening): the loop of DotTiles::qk_query_lanes (decode_dot_tiles.h) at head dim 128,
// its rows in L1, in the two forms it has had.
//   broadcast: the rows in fixed 128-bit lanes, K's 16 bytes of 8 dims broadcast to the 4 lanes
//              before each of the 16 vdpbf16ps (vbroadcasti32x4 from memory), 2 accumulators;
//   rotated:   K's 4 vectors used as they lie, the rows rotated across the lanes in the query
//              vectors, 4 accumulators rotated back with 3 lane shuffles a key (the kernel now).
// A loop of 16 independent vdpbf16ps calibrates the clock (one a cycle on Zen 4, where the
// bench's bf16-dot peak is twice its fp32 FMA peak; elsewhere read the cycles as relative).
//
// Not part of the build (a one-off measurement, AVX512_BF16 CPUs):
//   g++ -O3 -march=native -std=c++20 bench/probes/qk_lanes.cc -o /tmp/qk_lanes && /tmp/qk_lanes
//
// AMD EPYC Zen 4 class VM (2 vCPUs), 2026-12-03, three rounds: broadcast 22.7-25.1 cycles a key,
// rotated 15.9-17.2 (the 16 products alone: 16; the other core busy with a build); a first form
// of the same loops, the machine quiet: 23.7-24.9 / 16.2-16.3.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace {

alignas(64) uint8_t rows[16 * 1024];
__m512 sink;
__m512 sinks[16];

template <class F>
double ns_per_iter(F f, long iters) {
  const auto t0 = std::chrono::steady_clock::now();
  f(iters);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / iters;
}

void products(long n) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh w = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  for (long it = 0; it < n; ++it) {
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], w, w);
    asm volatile("" ::"v"(acc[0]));
  }
  for (int i = 0; i < 16; ++i) sinks[i] = acc[i];
}

void broadcast(long n) {
  __m512 q[16];
  for (int i = 0; i < 16; ++i) q[i] = _mm512_set1_ps(i * 0.001f);
  __m512 out = _mm512_setzero_ps();
  for (long it = 0; it < n; ++it) {
    const uint8_t* row = rows + (it & 15) * 256;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
#pragma GCC unroll 8
    for (int j = 0; j < 16; j += 2) {
      const __m512i k0 =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * j)));
      const __m512i k1 = _mm512_broadcast_i32x4(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * j + 16)));
      a0 = _mm512_dpbf16_ps(a0, (__m512bh)q[j], (__m512bh)k0);
      a1 = _mm512_dpbf16_ps(a1, (__m512bh)q[j + 1], (__m512bh)k1);
    }
    out = _mm512_add_ps(out, _mm512_add_ps(a0, a1));
    asm volatile("" ::"v"(out));
  }
  sink = out;
}

void rotated(long n) {
  __m512 q[16];
  for (int i = 0; i < 16; ++i) q[i] = _mm512_set1_ps(i * 0.001f);
  __m512 out = _mm512_setzero_ps();
  for (long it = 0; it < n; ++it) {
    const uint8_t* row = rows + (it & 15) * 256;
    __m512 a[4] = {};
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i k = _mm512_loadu_si512(row + 64 * c);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r)
        a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)q[4 * c + r], (__m512bh)k);
    }
    const __m512 p = _mm512_add_ps(_mm512_add_ps(a[0], _mm512_shuffle_f32x4(a[1], a[1], 0x93)),
                                   _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[2], 0x4E),
                                                 _mm512_shuffle_f32x4(a[3], a[3], 0x39)));
    out = _mm512_add_ps(out, p);
    asm volatile("" ::"v"(out));
  }
  sink = out;
}

}  // namespace

int main() {
  for (int i = 0; i < static_cast<int>(sizeof(rows)); ++i) rows[i] = static_cast<uint8_t>(i * 7);
  const long n = 2000000;
  for (int round = 0; round < 3; ++round) {
    const double cycle_ns = ns_per_iter(products, n) / 16;
    std::printf(
        "clock %.2f GHz (one vdpbf16ps a cycle): broadcast %.1f cycles a key, rotated %.1f\n",
        1 / cycle_ns, ns_per_iter(broadcast, n) / cycle_ns, ns_per_iter(rotated, n) / cycle_ns);
  }
  // The results read, so that no loop is dropped as dead.
  float check = _mm512_reduce_add_ps(sink);
  for (const __m512& v : sinks) check += _mm512_reduce_add_ps(v);
  return check == 12345.0f;
}
