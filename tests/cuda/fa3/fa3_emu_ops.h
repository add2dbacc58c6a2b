// fa3's kernel body (src/cuda/fa3/kernels/prefill_cta.h) over the SM90 CTA emulator
// (sm90_emulator.h): the Ops the body is written against, each call the emulated instruction of
// the thread (the device's are src/cuda/fa3/kernels/device_ops.cuh). S, O and P's fragments are
// the emulator's checked registers (Acc, AFrag), so the body's wgmma fence / commit / wait
// discipline is checked as it runs. The kernel parameters hold CUtensorMap objects; the replay's
// encoder (fa3_replay_test.cc) writes the address of the emulated map it made into the first 8
// bytes of each, and tma_load_4d reads it back (a map not encoded that way fails by name).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "core/numeric.h"
#include "cuda/common/fast_div.h"
#include "cuda/emulator/sm90_emulator.h"
#include "cuda/emulator/smem_banks.h"
#include "cuda/fa3/kernels/elem.h"
#include "cuda/fa3/kernels/l2_hint.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3::emu {

inline constexpr uint64_t kEmulatedMapTag = 0x6b76617474656d75ull;  // "kvattemu"

// Writes `map`'s address into a CUtensorMap's opaque bytes (with a tag the reader checks).
inline void store_emulated_map(CUtensorMap* cu, const TensorMap* map) {
  std::memset(cu, 0, sizeof(*cu));
  std::memcpy(reinterpret_cast<unsigned char*>(cu), &map, sizeof(map));
  std::memcpy(reinterpret_cast<unsigned char*>(cu) + 8, &kEmulatedMapTag, 8);
}

inline WgmmaType wgmma_type(ElemKind k) {
  switch (k) {
    case ElemKind::kBf16:
      return WgmmaType::kBf16;
    case ElemKind::kF16:
      return WgmmaType::kF16;
    case ElemKind::kE4m3:
      return WgmmaType::kE4m3;
    case ElemKind::kE5m2:
      return WgmmaType::kE5m2;
  }
  return WgmmaType::kBf16;
}

// The kernel body's global stores of O (out rows and split-KV partial rows) since the last reset:
// 16-byte vector stores and narrower ones, and the bytes they wrote.
struct OutputStores {
  std::atomic<int64_t> vector16 = 0, narrow = 0, bytes = 0;
  void reset() { vector16 = narrow = bytes = 0; }
  void add(std::size_t width) {
    ++(width == 16 ? vector16 : narrow);
    bytes += int64_t(width);
  }
};
inline OutputStores& output_stores() {
  static OutputStores s;
  return s;
}

// What the replay counts over the kernel body's operations, for every CTA of every replay since
// the last reset (a test resets, replays, reads): global loads by kind and L2 hint (l2_hint.h),
// wgmma instructions (m64nNk16 / k32, ss or rs) per warpgroup (0 the producer, 1 and 2 the
// consumers), fast divisions (fast_div: the page lookups of paged K/V rows), by every thread, and
// the st.shared instructions of each warp with their wavefronts (smem_banks.h's model) by the
// tile they write (SmemTile, from fa3's SmemPlan: fa3_replay_ctas.h); the asynchronous copies
// (TMA boxes, cp.async chunks) by the tile they land in; and the K/V blocks the replayed launches'
// tile lists name (kv_blocks: the plan's, counted by fa3_replay.cc from the tiles' K/V ranges,
// not by the body), which is what a producer must load once each into the K ring and the V ring.
// Who fills the Q tiles: the bytes each warpgroup loads from global memory (ld16, ld8, ld_byte)
// and the bytes it writes into a Q tile, by asynchronous copy or by st.shared (the consumers'
// epilogue stages O there by st.shared), against q_rows, the Q rows the tile lists name (every
// tile's 64 rows per computing consumer warpgroup, from the plan: fa3_replay.cc).
// kCpAsyncQ: cp.async into a Q tile (L2 hints: Q's apart from K/V's); tile_copies counts it as
// kCpAsync.
enum class LoadKind : int {
  kTmaBox,
  kCpAsync,
  kLd16Producer,
  kLd16Consumer,
  kLd8Producer,
  kCpAsyncQ,
  kCount
};
// kVStage: FP8 V as TMA lands it, before the producer's transpose (SmemPlan::v_stage).
enum class SmemTile : int { kQ, kK, kV, kVStage, kOther, kCount };
struct ReplayCounters {
  std::atomic<int64_t> loads[int(LoadKind::kCount)][3] = {};
  std::atomic<int64_t> tile_copies[int(SmemTile::kCount)][int(LoadKind::kCount)] = {};
  std::atomic<int64_t> kv_blocks = 0;
  std::atomic<int64_t> global_load_bytes[3] = {};
  std::atomic<int64_t> q_tile_async_bytes[3] = {}, q_tile_stored_bytes[3] = {};
  std::atomic<int64_t> q_rows = 0;
  std::atomic<int64_t> wgmma[3] = {};
  std::atomic<int64_t> fast_divs = 0;
  // The consumer ping-pong's turns per warpgroup (fa3_pingpong.h; CTAs with two consumers).
  std::atomic<int64_t> pingpong_turns[3] = {};
  struct Stores {
    std::atomic<int64_t> instructions = 0, wavefronts = 0, min_wavefronts = 0, divergent = 0;
  };
  Stores stores[int(SmemTile::kCount)];
  Stores smem_loads[int(SmemTile::kCount)];  // ld.shared by the tile read, as the stores
  void reset() {
    for (auto& kind : loads)
      for (auto& n : kind) n = 0;
    for (auto& n : wgmma) n = 0;
    for (auto& n : pingpong_turns) n = 0;
    for (auto& tile : tile_copies)
      for (auto& n : tile) n = 0;
    kv_blocks = 0;
    for (int wg = 0; wg < 3; ++wg) {
      global_load_bytes[wg] = q_tile_async_bytes[wg] = q_tile_stored_bytes[wg] = 0;
    }
    q_rows = 0;
    fast_divs = 0;
    for (Stores& st : stores)
      st.instructions = st.wavefronts = st.min_wavefronts = st.divergent = 0;
    for (Stores& st : smem_loads)
      st.instructions = st.wavefronts = st.min_wavefronts = st.divergent = 0;
  }
  int64_t count(LoadKind k, L2Hint h) const { return loads[int(k)][int(h)]; }
  // TMA boxes or cp.async chunks (k) that landed in tile t.
  int64_t copies(SmemTile t, LoadKind k) const { return tile_copies[int(t)][int(k)]; }
  void add_stores(SmemTile t, const AccessStats& a) { add(stores[int(t)], a); }
  void add_loads(SmemTile t, const AccessStats& a) { add(smem_loads[int(t)], a); }
  static void add(Stores& st, const AccessStats& a) {
    st.instructions += a.instructions;
    st.wavefronts += a.wavefronts;
    st.min_wavefronts += a.min_wavefronts;
    st.divergent += a.divergent;
  }
};
inline ReplayCounters& replay_counters() {
  static ReplayCounters c;
  return c;
}

// One CTA's st.shared instructions, grouped into warp instructions (smem_banks.h), with the tile
// each writes: tile_of(offset from the CTA's 1024-byte aligned tiles' base).
// Its ld.shared likewise (load_counter).
struct SmemStoreCounting {
  WarpAccessCounter counter;
  WarpAccessCounter load_counter;
  std::function<SmemTile(uint32_t)> tile_of;
  uint32_t base = 0;  // the tiles' shared address (prefill_cta's rounding of the dynamic base)
  void record(int thread, uint32_t addr, int bytes) {
    counter.record(thread, int(tile_of(addr - base)), addr, bytes);
  }
  void record_load(int thread, uint32_t addr, int bytes) {
    load_counter.record(thread, int(tile_of(addr - base)), addr, bytes);
  }
  // Into replay_counters() once the CTA has run.
  void publish();
};

class Fa3EmuOps {
 public:
  template <int N>
  using Acc = emu::Acc<N>;
  using AFrag = emu::AFrag;
  struct alignas(16) U4 {
    uint32_t x, y, z, w;
  };
  struct alignas(8) U2 {
    uint32_t x, y;
  };

  Fa3EmuOps(const Sm90Ops& ops, int cta, int ctas, SmemStoreCounting* stores = nullptr)
      : ops_(ops), cta_(cta), ctas_(ctas), stores_(stores) {}

  unsigned thread() const { return unsigned(ops_.thread()); }
  int cta() const { return cta_; }
  int ctas() const { return ctas_; }
  uint32_t smem_addr(const void* p) const { return ops_.smem_addr(p); }
  U4 ld16(const void* p, L2Hint hint = L2Hint::kNormal) const {
    count_load(ops_.thread() < 128 ? LoadKind::kLd16Producer : LoadKind::kLd16Consumer, hint);
    count_global_load(16);
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      throw EmulatorError("warp " + std::to_string(ops_.warp()) + " thread " +
                          std::to_string(ops_.thread()) +
                          ": ld.global.v4.u32 of a global address not 16-byte aligned");
    }
    U4 v;
    std::memcpy(&v, p, 16);
    return v;
  }
  // The FP8 producer's V pieces (prefill_cta.h's copy_v_transposed).
  U2 ld8(const void* p, L2Hint hint = L2Hint::kNormal) const {
    count_load(LoadKind::kLd8Producer, hint);
    count_global_load(8);
    if (reinterpret_cast<uintptr_t>(p) % 8 != 0) {
      throw EmulatorError("warp " + std::to_string(ops_.warp()) + " thread " +
                          std::to_string(ops_.thread()) +
                          ": ld.global.v2.u32 of a global address not 8-byte aligned");
    }
    U2 v;
    std::memcpy(&v, p, 8);
    return v;
  }
  uint8_t ld_byte(const void* p) const {
    count_global_load(1);
    return *static_cast<const uint8_t*>(p);
  }
  template <class T>
  void st_shared(T* p, T v) const {
    ops_.st_shared(p, v);
    if (stores_ == nullptr) return;
    stores_->record(ops_.thread(), ops_.smem_addr(p), int(sizeof(T)));
    if (tile_of(p) == SmemTile::kQ) {
      replay_counters().q_tile_stored_bytes[ops_.thread() / 128] += int64_t(sizeof(T));
    }
  }
  // The epilogue's global stores (epilogue.h), counted by width (output_stores()).
  template <class T>
  void st_global(T* p, T v) const {
    if (reinterpret_cast<uintptr_t>(p) % sizeof(T) != 0) {
      throw EmulatorError("warp " + std::to_string(ops_.warp()) + " thread " +
                          std::to_string(ops_.thread()) + ": st.global of " +
                          std::to_string(sizeof(T)) + " bytes to an address not aligned to it");
    }
    output_stores().add(sizeof(T));
    std::memcpy(p, &v, sizeof(T));
  }

  uint32_t fast_div(const cuda::FastDiv& d, uint32_t n) const {
    ++replay_counters().fast_divs;
    return d.div(n);
  }

  void mbarrier_init(uint64_t* bar, int count) const { ops_.mbarrier_init(bar, count); }
  void fence_barrier_init() const { ops_.fence_barrier_init(); }
  void mbarrier_arrive(uint64_t* bar) const { ops_.mbarrier_arrive(bar); }
  void mbarrier_wait(uint64_t* bar, uint32_t parity) const { ops_.mbarrier_wait(bar, parity); }
  void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) const {
    ops_.mbarrier_arrive_expect_tx(bar, bytes);
  }
  void tma_load_4d(void* smem_dst, const void* cu_map, int c0, int c1, int c2, int c3,
                   uint64_t* bar, L2Hint hint = L2Hint::kNormal) const {
    count_load(LoadKind::kTmaBox, hint);
    count_copy(LoadKind::kTmaBox, smem_dst);
    const TensorMap* map = nullptr;
    uint64_t tag = 0;
    std::memcpy(&map, cu_map, sizeof(map));
    std::memcpy(&tag, static_cast<const unsigned char*>(cu_map) + 8, 8);
    if (tag != kEmulatedMapTag || map == nullptr) {
      throw EmulatorError("warp " + std::to_string(ops_.warp()) +
                          ": cp.async.bulk.tensor.4d with a tensor map the replay did not encode");
    }
    if (map->rank != 4) {
      throw EmulatorError("warp " + std::to_string(ops_.warp()) +
                          ": cp.async.bulk.tensor.4d with a tensor map of rank " +
                          std::to_string(map->rank));
    }
    const int coords[4] = {c0, c1, c2, c3};
    ops_.tma_load(smem_dst, map, coords, bar);
  }
  void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid,
                         L2Hint hint = L2Hint::kNormal) const {
    const bool q = stores_ != nullptr && tile_of(smem_dst) == SmemTile::kQ;
    count_load(q ? LoadKind::kCpAsyncQ : LoadKind::kCpAsync, hint);
    count_copy(LoadKind::kCpAsync, smem_dst);
    if (q) replay_counters().q_tile_async_bytes[ops_.thread() / 128] += 16;
    ops_.cp_async_16_zfill(smem_dst, gmem_src, valid);
  }
  void cp_async_wait_all() const { ops_.cp_async_wait_all(); }
  void cp_async_mbarrier_arrive_noinc(uint64_t* bar) const {
    ops_.cp_async_mbarrier_arrive_noinc(bar);
  }
  void fence_proxy_async() const { ops_.fence_proxy_async(); }
  void named_barrier_sync(int id, int threads) const { ops_.named_barrier_sync(id, threads); }
  void named_barrier_arrive(int id, int threads) const { ops_.named_barrier_arrive(id, threads); }
  void sync_threads() const { ops_.sync_threads(); }
  template <int N>
  void setmaxnreg_inc() const {
    ops_.setmaxnreg(true, N);
  }
  template <int N>
  void setmaxnreg_dec() const {
    ops_.setmaxnreg(false, N);
  }
  float shfl_xor(float v, int lane_mask) const { return ops_.shfl_xor(v, lane_mask); }
  float shfl(float v, int src_lane) const { return ops_.shfl(v, src_lane); }
  uint32_t shfl_u32(uint32_t v, int src_lane) const {
    float f;
    std::memcpy(&f, &v, 4);
    f = ops_.shfl(f, src_lane);
    std::memcpy(&v, &f, 4);
    return v;
  }
  void syncwarp() const { ops_.syncwarp(); }
  template <class T>
  T ld_shared(const T* p) const {
    if (stores_ != nullptr) stores_->record_load(ops_.thread(), ops_.smem_addr(p), int(sizeof(T)));
    return ops_.ld_shared(p);
  }
  bool named_barrier_red_or(int id, int threads, bool pred) const {
    return ops_.named_barrier_red_or(id, threads, pred);
  }

  void wgmma_fence() const { ops_.wgmma_fence(); }
  void wgmma_commit() const { ops_.wgmma_commit(); }
  template <int Pending>
  void wgmma_wait() const {
    ops_.wgmma_wait(Pending);
  }
  // S (+)= Q K^T: A = Q (q's type), B = K (the cache's), both K-major.
  template <class Tag, int N, int NR>
  void wgmma_ss(Acc<NR>& d, uint64_t a_desc, uint64_t b_desc, int accumulate) const {
    static_assert(2 * NR == N, "m64nN: N / 2 accumulators per thread");
    count_wgmma();
    ops_.wgmma_ss(d, wgmma_type(Elem<Tag>::kQ), wgmma_type(Elem<Tag>::kKv), a_desc, false, b_desc,
                  false, accumulate != 0);
  }
  // O (+)= P V: P from registers (q's 16-bit type, or e4m3 for every FP8 pair), V MN-major for
  // 16-bit ("transposed"), K-major (stored transposed) for FP8.
  template <class Tag, int N, int NR>
  void wgmma_rs(Acc<NR>& d, AFrag& a, uint64_t b_desc, int accumulate) const {
    static_assert(2 * NR == N, "m64nN: N / 2 accumulators per thread");
    constexpr bool kFp8 = Elem<Tag>::kFp8;
    count_wgmma();
    ops_.wgmma_rs(d, kFp8 ? WgmmaType::kE4m3 : wgmma_type(Elem<Tag>::kQ),
                  wgmma_type(Elem<Tag>::kKv), a, b_desc, !kFp8, accumulate != 0);
  }
  // The compiler-only register fences of the device: nothing to do here (the emulator's
  // registers check the order themselves).
  template <class R>
  void fence_registers(R&) const {}
  template <class Tag>
  uint32_t pack16(float lo, float hi) const {
    const bool f16 = Elem<Tag>::kQ == ElemKind::kF16;
    const uint16_t l = f16 ? num::f32_to_f16(lo) : num::f32_to_bf16(lo);
    const uint16_t h = f16 ? num::f32_to_f16(hi) : num::f32_to_bf16(hi);
    return uint32_t(l) | (uint32_t(h) << 16);
  }
  // cvt.rn.satfinite.e4m3x2.f32 twice: x0 in the lowest byte.
  uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) const {
    return uint32_t(num::f32_to_e4m3(x0)) | (uint32_t(num::f32_to_e4m3(x1)) << 8) |
           (uint32_t(num::f32_to_e4m3(x2)) << 16) | (uint32_t(num::f32_to_e4m3(x3)) << 24);
  }

 private:
  static void count_load(LoadKind k, L2Hint h) { ++replay_counters().loads[int(k)][int(h)]; }
  void count_global_load(int bytes) const {
    replay_counters().global_load_bytes[ops_.thread() / 128] += bytes;
  }
  // The tile a shared address lies in (stores_ set).
  SmemTile tile_of(const void* p) const {
    return stores_->tile_of(ops_.smem_addr(p) - stores_->base);
  }
  // An asynchronous copy by the tile it lands in (where the CTA counts its stores' tiles).
  void count_copy(LoadKind k, const void* smem_dst) const {
    if (stores_ == nullptr) return;
    const SmemTile t = stores_->tile_of(ops_.smem_addr(smem_dst) - stores_->base);
    ++replay_counters().tile_copies[int(t)][int(k)];
  }
  // Counted by the warpgroup's first thread: one per warpgroup instruction.
  void count_wgmma() const {
    if (ops_.thread() % 128 == 0) ++replay_counters().wgmma[ops_.thread() / 128];
  }

  const Sm90Ops& ops_;
  int cta_, ctas_;
  SmemStoreCounting* stores_;
};

inline void SmemStoreCounting::publish() {
  counter.flush();
  load_counter.flush();
  for (int t = 0; t < int(SmemTile::kCount); ++t) {
    replay_counters().add_stores(SmemTile(t), counter.stats(t));
    replay_counters().add_loads(SmemTile(t), load_counter.stats(t));
  }
}

}  // namespace kvattn::fa3::emu
