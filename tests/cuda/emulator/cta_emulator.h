// A CPU emulator of one CUDA thread block for fa2's kernel body (attention_cta.h), written over
// the Ops interface of src/cuda/fa2/kernels/cta_ops.h: one std::thread per CUDA thread, each
// with an EmuOps handle whose warp collectives (shfl, ldmatrix, mma) follow the PTX ISA's
// definitions (warp_emulation.h) and whose cp.async copies land only at cp.async.wait_group, so
// a body that reads a tile before waiting for it reads stale shared memory.
//
// The emulator checks what the hardware would leave undefined, and fails the run with a message
// naming the threads: lanes of a warp at different collectives (or one exited), a CTA barrier
// some threads never reach (every live thread blocked: reported at once), a thread that exits
// with cp.async copies uncommitted or not waited for, ldmatrix/cp.async addresses outside the
// CTA's shared memory or misaligned. Shared memory starts as 0xff bytes (NaN in f16 and bf16),
// so results that read never-written shared memory come out NaN. A wait that makes no progress
// for the watchdog's time (a thread looping outside the emulator while others wait) prints
// "emulator deadlock: ..." and aborts.
//
// Memory is ordered as on the GPU: a warp collective orders the memory of its warp's lanes, only
// a CTA barrier (sync, sync_or) orders it across warps, so under ThreadSanitizer a body that
// writes shared memory in one warp and reads it in another without a barrier between is a
// reported race. (More lenient than the GPU within a warp, where a shuffle does not order memory
// and only __syncwarp would: a race between lanes of one warp goes unreported.)
// Waits block on a futex (std::atomic::wait); a collective costs a few microseconds per thread.
//
//   emu::Cta cta(128, smem_bytes);
//   cta.run([&](const emu::EmuOps& ops, unsigned char* smem) { attention_cta<Config>(ops, ...); });
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>

#include "cuda/emulator/warp_emulation.h"

namespace kvattn::fa2::emu {

// What run() throws when the body broke a rule of the hardware (the message says which threads).
class EmulatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class EmuOps;

namespace detail {

class CtaState;

// The collective operations; lanes of a warp (threads of the CTA, for the barriers) must agree.
enum class Op : uint8_t {
  kNone,
  kSync,
  kSyncOr,
  kShflXor,
  kShfl,
  kLdmatrix,
  kLdmatrixTrans,
  kMmaBf16,
  kMmaF16
};
const char* op_name(Op op);

// One participant's operands and results at a collective.
struct Slot {
  Op op = Op::kNone;
  const uint16_t* row = nullptr;  // ldmatrix: this lane's row address
  int arg = 0;                    // shfl: source lane or lane mask; sync_or: the predicate
  float value = 0.0f;             // shfl: in and out
  uint32_t a[4] = {};             // mma: A; ldmatrix: the four result registers
  uint32_t b[2] = {};             // mma: B
  float acc[4] = {};              // mma: C in, D out
};
// Computes every lane's results from the 32 slots of a warp; run by the last lane to arrive.
using WarpCompute = void (*)(Slot* lanes);

void warp_collective(CtaState& cta, int thread, Slot& io, WarpCompute compute);
bool cta_barrier(CtaState& cta, int thread, Op op, bool pred);
void cp_async_issue(CtaState& cta, int thread, void* smem, const void* gmem, bool valid);
void cp_async_commit(CtaState& cta, int thread);
void cp_async_wait(CtaState& cta, int thread, int newest_pending);
void run_cta(int threads, unsigned char* smem, std::size_t smem_bytes,
             std::chrono::milliseconds watchdog, const std::function<void(const EmuOps&)>& body);

template <class F>
void mma_compute(Slot* lanes) {
  WarpRegs<uint16_t, 4> a;
  WarpRegs<uint16_t, 2> b;
  WarpAcc d;
  for (int lane = 0; lane < 32; ++lane) {
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 4; ++i) a[lane][i][h] = uint16_t(lanes[lane].a[i] >> (16 * h));
      for (int i = 0; i < 2; ++i) b[lane][i][h] = uint16_t(lanes[lane].b[i] >> (16 * h));
    }
    for (int e = 0; e < 4; ++e) d[lane][e] = lanes[lane].acc[e];
  }
  mma_m16n8k16(d, a, b, [](uint16_t x) { return F::to_float(x); });
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 4; ++e) lanes[lane].acc[e] = d[lane][e];
  }
}

}  // namespace detail

// One emulated thread's operations (cta_ops.h documents each); made by Cta::run.
class EmuOps {
 public:
  int thread() const { return thread_; }
  void sync() const { detail::cta_barrier(*cta_, thread_, detail::Op::kSync, false); }
  bool sync_or(bool pred) const {
    return detail::cta_barrier(*cta_, thread_, detail::Op::kSyncOr, pred);
  }
  float shfl_xor(float v, int lane_mask) const;
  float shfl(float v, int src_lane) const;
  void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) const;
  void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) const;
  template <class F>
  void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) const {
    detail::Slot s;
    s.op = F::kF16 ? detail::Op::kMmaF16 : detail::Op::kMmaBf16;
    std::memcpy(s.a, a, sizeof s.a);
    s.b[0] = b0;
    s.b[1] = b1;
    std::memcpy(s.acc, d, sizeof s.acc);
    detail::warp_collective(*cta_, thread_, s, &detail::mma_compute<F>);
    std::memcpy(d, s.acc, sizeof s.acc);
  }
  void cp_async_16(void* smem, const void* gmem, bool valid) const {
    detail::cp_async_issue(*cta_, thread_, smem, gmem, valid);
  }
  void cp_async_commit() const { detail::cp_async_commit(*cta_, thread_); }
  template <int N>
  void cp_async_wait() const {
    static_assert(N >= 0);
    detail::cp_async_wait(*cta_, thread_, N);
  }
  template <class T>
  T ldg(const T* p) const {
    return *p;
  }

 private:
  friend class detail::CtaState;
  EmuOps(detail::CtaState* cta, int thread) : cta_(cta), thread_(thread) {}
  void load_matrices(uint32_t (&r)[4], const uint16_t* row, detail::Op op) const;

  detail::CtaState* cta_;
  int thread_;
};

// One thread block: `threads` (a multiple of 32, at most 1024) and `smem_bytes` of shared memory
// (128-byte aligned, filled with 0xff), which persists across runs.
class Cta {
 public:
  Cta(int threads, std::size_t smem_bytes);

  // Runs body(const EmuOps& ops, unsigned char* smem) on `threads` std::threads at once (the
  // same body object; ops.thread() being 0 .. threads-1) and joins them. Throws EmulatorError when
  // the body broke a rule (the message, also printed, says which), or rethrows the first exception
  // a thread's body threw.
  template <class Body>
  void run(Body&& body) {
    unsigned char* const smem = smem_.get();
    detail::run_cta(threads_, smem, smem_bytes_, watchdog_,
                    [&body, smem](const EmuOps& ops) { body(ops, smem); });
  }

  unsigned char* smem() { return smem_.get(); }
  std::size_t smem_bytes() const { return smem_bytes_; }
  int threads() const { return threads_; }
  // How long a wait may make no progress before the emulator reports a deadlock and aborts.
  void set_watchdog(std::chrono::milliseconds timeout) { watchdog_ = timeout; }

 private:
  struct AlignedFree {
    void operator()(unsigned char* p) const;
  };
  int threads_;
  std::size_t smem_bytes_;
  std::unique_ptr<unsigned char[], AlignedFree> smem_;
  std::chrono::milliseconds watchdog_{std::chrono::seconds(120)};
};

}  // namespace kvattn::fa2::emu
