// A CPU emulator of one SM90 thread block (fa3's CTA: three warpgroups of 128 threads), written
// from the PTX ISA for the instructions fa3's kernels are built from (src/cuda/fa3/kernels/
// sm90_ptx.cuh): wgmma.mma_async with its fence / commit_group / wait_group rules, mbarrier
// (init, arrive, expect_tx, try_wait.parity), TMA tiled loads through an emulated tensor map,
// cp.async with zero fill, fence.proxy.async, named barriers, setmaxnreg, warp shuffles, and
// shared-memory loads and stores.
//
// Threading: every CUDA thread is a fiber (ucontext, its own stack), all fibers run on the
// calling OS thread, switched cooperatively at the instructions that wait (collectives, barriers,
// mbarrier waits, setmaxnreg.inc). The schedule is deterministic; no OS threads, no locks, so
// ThreadSanitizer has nothing to report and the cost is a context switch per wait (the sanitizer
// builds annotate the switches). A wait that cannot be satisfied is known at once: when no fiber
// can run and no asynchronous copy is in flight the run fails listing every waiting warp and the
// instruction it waits at (a missed arrive, a barrier some warps never reach).
//
// Asynchrony is emulated late on purpose, so a body that does not wait reads stale data:
// - wgmma.mma_async reads its shared-memory operands and writes its accumulators when a
//   wgmma.wait_group retires it; until then the accumulator registers hold NaN, and reading or
//   writing them (or the A fragment of the register form) fails. A register written by the
//   thread after its last wgmma.fence, then used by a wgmma, fails (the fence rule); so does a
//   wgmma before the thread's first wgmma.fence.
// - TMA loads land (shared memory written, transaction bytes completed on the mbarrier) only when
//   no fiber can make progress otherwise; cp.async copies land at the cp.async.wait_group that
//   retires their group, or, handed to an mbarrier (cp.async.mbarrier.arrive.noinc), as TMA
//   loads do.
// - Shared memory starts as 0xff bytes (NaN in every float format used).
//
// Every violation throws EmulatorError from Sm90Cta::run with a message naming the warp (and
// thread) and the instruction. The rules (each has a test in sm90_emulator_test.cc):
//   collectives: the 32 lanes of a warp (shfl) or 128 threads of a warpgroup (wgmma.*,
//     setmaxnreg) at the same instruction with uniform operands; a thread exiting while its
//     group waits.
//   wgmma: descriptor decoding (start, LBO, SBO, layout type none / 32B / 64B / 128B swizzle;
//     a nonzero base offset is refused as not modelled), operands inside shared memory, FP8
//     K-major only, the fence / in-flight rules above, nothing in flight at exit.
//   mbarrier: 8-byte aligned in shared memory, initialised before use (count 1 .. 2^20 - 1), not
//     re-initialised with a phase in progress, tx-count within +-(2^20 - 1), the initialisation
//     fenced (fence.mbarrier_init) before a TMA completes on it, and a wait whose parity names a
//     phase the barrier has already gone past ("phase reused early": the waiter fell a whole
//     phase behind, so the parity it names is ambiguous).
//   TMA: the tensor map encoded by encode_tensor_map_tiled, which checks cuTensorMapEncodeTiled's
//     rules (rank 1..5, 16-byte aligned base and strides, strides < 2^40, dims 1 .. 2^32, box
//     1..256, inner box a multiple of 16 bytes and at most the swizzle span, element strides
//     1..8); the destination aligned to 128 bytes (to the swizzle's repeat, 256 / 512 / 1024
//     bytes, when swizzled) and inside shared memory; out-of-range elements zero-filled.
//   cp.async: 4/8/16 bytes, both addresses aligned to the size, the source size at most the copy
//     size (the rest zero-filled), every copy committed and waited for before the thread exits,
//     or handed to an mbarrier by cp.async.mbarrier.arrive.noinc: those land (then arrive on it)
//     when TMA loads do (late, or early), their bytes unfenced for the async proxy until a thread
//     that saw that mbarrier phase complete executes fence.proxy.async; a CTA exiting with such
//     copies in flight fails.
//   operands in flight: a shared-memory write (st.shared, a cp.async or TMA landing) to a
//     16-byte chunk an unretired wgmma reads fails naming the writer (a K/V slot handed back
//     before its readers' wgmma.wait_group). With Sm90Launch::tma_lands_early and the schedule
//     below (an mbarrier phase's waiters run right after the arrival that completes it, racing
//     the arriver's warpgroup), a slot released early is overwritten while still read.
//   proxy: each shared-memory byte remembers an unfenced generic-proxy write (st.shared or a
//     landed cp.async) until its writer executes fence.proxy.async; an async-proxy read of it
//     (a wgmma operand, read at retire) fails naming both threads.
//   named barriers: id 0..15, thread count a positive multiple of 32 and at most the CTA's, the
//     same count from every participant of a phase, a thread not arriving twice in one phase,
//     bar.red not mixed with bar.sync / bar.arrive in one phase.
//   setmaxnreg: 24 .. 256, a multiple of 8, .inc not below and .dec not above the current
//     count; .inc waits until the SM's 64 K registers have room (released by .dec).
//   shared memory: at most 227 KiB; every access inside it and aligned to its size.
//
// Not modelled (documented, refused where they would matter): clusters and multicast, TMA
// stores / im2col / interleaved maps / element strides other than 1 / swizzled boxes narrower
// than the swizzle span, memory ordering across threads (the schedule is sequential).
//
// wgmma's sums: 16-bit types exact in double, rounded once to f32. FP8 types in reduced precision,
// as Hopper's tensor cores add them (testing/fp8_accumulation.h: per instruction, the incoming
// accumulator and the 32 exact products aligned to the largest one's leading bit, the bits more
// than 13 below it dropped). An accumulator carried through many wgmmas stalls once it is 2^13
// times the products; the hardware's exact truncation point is not documented, so a kernel is
// checked against this model, not its bits.
//
//   emu::Sm90Cta cta({.threads = 384, .smem_bytes = bytes, .regs_per_thread = 168});
//   cta.run([&](emu::Sm90Ops& ops, unsigned char* smem) { ... });
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvattn::fa3::emu {

class EmulatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::size_t kMaxSmemBytes = 227 * 1024;  // SM90's opt-in limit per block
inline constexpr int kSmRegisters = 64 * 1024;

namespace detail {
class CtaState;
struct ThreadState;
// The fiber running now (null outside Sm90Cta::run); the register types below check against it.
ThreadState* current_thread();
struct RegTrack {
  int owner = -1;     // thread that last used the registers in a wgmma
  int in_flight = 0;  // wgmma.mma_async operations not yet retired that use them
  uint64_t written_at_fence = std::numeric_limits<uint64_t>::max();  // fence count at last write
  const char* what = "";
};
void reg_read(const RegTrack& t, int index);
void reg_write(RegTrack& t, int index);
// Registers going out of scope while a wgmma in flight still writes or reads them: fails the run.
void reg_destroyed(RegTrack& t) noexcept;
}  // namespace detail

// wgmma's f32 accumulator registers of one thread (N registers: the thread's share of an
// m64n(2N) tile). Element access is checked: touching a register a wgmma in flight will
// write fails, and a write marks it as needing a wgmma.fence before the next wgmma that uses it.
template <int N>
class Acc {
 public:
  class Ref {
   public:
    operator float() const {
      detail::reg_read(a_->track_, i_);
      return a_->v_[i_];
    }
    Ref& operator=(float x) {
      detail::reg_write(a_->track_, i_);
      a_->v_[i_] = x;
      return *this;
    }
    Ref& operator=(const Ref& o) { return *this = float(o); }
    Ref& operator+=(float x) { return *this = float(*this) + x; }
    Ref& operator-=(float x) { return *this = float(*this) - x; }
    Ref& operator*=(float x) { return *this = float(*this) * x; }
    Ref& operator/=(float x) { return *this = float(*this) / x; }

   private:
    friend class Acc;
    Ref(Acc* a, int i) : a_(a), i_(i) {}
    Acc* a_;
    int i_;
  };
  static constexpr int kSize = N;
  Acc() { track_.what = "accumulator"; }
  Acc(const Acc&) = delete;
  Acc& operator=(const Acc&) = delete;
  ~Acc() {
    if (track_.in_flight > 0) detail::reg_destroyed(track_);
  }
  Ref operator[](int i) { return Ref(this, i); }
  float operator[](int i) const {
    detail::reg_read(track_, i);
    return v_[i];
  }
  // For the emulator: the registers and their state, unchecked.
  float* raw() { return v_; }
  detail::RegTrack& track() { return track_; }

 private:
  float v_[N] = {};
  detail::RegTrack track_;
};

// The A fragment of the register form of wgmma (four b32 registers), checked the same way.
class AFrag {
 public:
  class Ref {
   public:
    operator uint32_t() const {
      detail::reg_read(f_->track_, i_);
      return f_->v_[i_];
    }
    Ref& operator=(uint32_t x) {
      detail::reg_write(f_->track_, i_);
      f_->v_[i_] = x;
      return *this;
    }

   private:
    friend class AFrag;
    Ref(AFrag* f, int i) : f_(f), i_(i) {}
    AFrag* f_;
    int i_;
  };
  AFrag() { track_.what = "A-fragment"; }
  AFrag(const AFrag&) = delete;
  AFrag& operator=(const AFrag&) = delete;
  ~AFrag() {
    if (track_.in_flight > 0) detail::reg_destroyed(track_);
  }
  Ref operator[](int i) { return Ref(this, i); }
  uint32_t* raw() { return v_; }
  detail::RegTrack& track() { return track_; }

 private:
  uint32_t v_[4] = {};
  detail::RegTrack track_;
};

// Element types of wgmma operands.
enum class WgmmaType : uint8_t { kBf16, kF16, kE4m3, kE5m2 };
int wgmma_type_bytes(WgmmaType t);
const char* wgmma_type_name(WgmmaType t);

// The layout type of a wgmma matrix descriptor (bits 62-63) and a TMA swizzle mode.
enum class Swizzle : uint8_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };
int swizzle_span_bytes(Swizzle s);  // 16 for none (one core-matrix row), else 32/64/128
// The XOR pattern of a swizzle on a shared-memory byte address.
uint32_t swizzle_address(Swizzle s, uint32_t address);

// A decoded wgmma matrix descriptor (PTX ISA, "Matrix Descriptor Format").
struct MatrixDesc {
  uint32_t start = 0, lbo = 0, sbo = 0;  // bytes
  uint32_t base_offset = 0;              // bits 49-51
  Swizzle layout = Swizzle::kNone;
};
MatrixDesc decode_desc(uint64_t bits);
uint64_t encode_desc(const MatrixDesc& d);
// The shared-memory byte address of element (mn, k) of a k-step read through `d` (the canonical
// layouts of the PTX ISA; T = 16 / elem_bytes elements per 16 bytes):
//   K-major:  none ((8,m),(T,2)):((1T,SBO),(1,LBO)); 32B/64B/128B ((8,m),(T,2)):((ST,SBO),(1,T))
//             with S = 2 / 4 / 8 (the row pitch in 16-byte units);
//   MN-major: none ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)); swizzled ((T,S,m),(8,k)):((1,T,LBO),
//             (ST,SBO));
// in elements before the swizzle, which then applies to the address bits.
uint32_t desc_address(const MatrixDesc& d, bool mn_major, int mn, int k, int elem_bytes);

// An emulated CUtensorMap (tiled, no interleave), made only by encode_tensor_map_tiled.
struct TensorMap {
  WgmmaType type = WgmmaType::kBf16;  // element type (its size is what matters)
  int elem_bytes = 2;
  int rank = 0;
  const void* global = nullptr;
  uint64_t dims[5] = {};
  uint64_t strides[5] = {};  // bytes; strides[0] is the element size
  uint32_t box[5] = {};
  Swizzle swizzle = Swizzle::kNone;
  uint32_t box_bytes() const;
};
// cuTensorMapEncodeTiled's parameters (global_strides: rank - 1 byte strides of dims 1..),
// checked against its rules; throws EmulatorError naming the argument, its value and the rule.
TensorMap encode_tensor_map_tiled(WgmmaType type, int rank, const void* global,
                                  const uint64_t* global_dims, const uint64_t* global_strides,
                                  const uint32_t* box_dims, const uint32_t* element_strides,
                                  Swizzle swizzle);

class Sm90Ops;

// The order in which a CTA's warpgroups issued their wgmma instructions: one entry per warpgroup
// collective that completed (the last of its 128 threads arrived), in completion order across
// the CTA: a wgmma.mma_async (A from shared memory, or from registers) or a wgmma.commit_group.
// A schedule between warpgroups (FA3's consumer ping-pong: fa3's replay checks it) is asserted
// on this order; the emulator itself only records it.
struct WgmmaEvent {
  enum Kind : uint8_t { kIssueSs, kIssueRs, kCommit };
  Kind kind;
  uint8_t warpgroup;
};

struct Sm90Launch {
  int threads = 384;                  // a multiple of 128 (whole warpgroups), at most 1024
  std::size_t smem_bytes = 0;         // dynamic shared memory, at most 227 KiB
  int regs_per_thread = 168;          // the kernel's register count at launch (ptxas)
  int fiber_stack_bytes = 256 << 10;  // each emulated thread's stack
  // When TMA loads land. false: only once no thread can make progress otherwise (a body that
  // reads a box before its mbarrier says so reads the old bytes). true: at the issuing thread's
  // next switch (a slot handed back to the producer while a wgmma still reads it is overwritten
  // under it, and fails). Replays run both.
  bool tma_lands_early = false;
};

namespace detail {
void run_cta(CtaState& cta, const std::function<void(Sm90Ops&)>& body);
const std::vector<WgmmaEvent>& cta_wgmma_log(const CtaState& cta);
std::unique_ptr<CtaState, void (*)(CtaState*)> make_cta(const Sm90Launch& launch);
unsigned char* cta_smem(CtaState& cta);
void wgmma_issue(ThreadState& t, int n, WgmmaType ta, WgmmaType tb, uint64_t a_desc, bool a_trans,
                 AFrag* a_regs, uint64_t b_desc, bool b_trans, float* d, RegTrack& d_track,
                 bool accumulate);
}  // namespace detail

// One emulated thread's instructions (named as in sm90_ptx.cuh); made by Sm90Cta::run.
class Sm90Ops {
 public:
  explicit Sm90Ops(detail::ThreadState* t) : t_(t) {}  // made by the emulator
  int thread() const;
  int warp() const { return thread() / 32; }
  int lane() const { return thread() % 32; }
  int warpgroup() const { return thread() / 128; }

  // Shared memory: the offset of a pointer into it (what cvta.to.shared gives the kernel).
  uint32_t smem_addr(const void* p) const;
  template <class T>
  T ld_shared(const T* p) const {
    T v;
    shared_access(p, sizeof(T), false, "ld.shared");
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  template <class T>
  void st_shared(T* p, T v) const {
    shared_access(p, sizeof(T), true, "st.shared");
    std::memcpy(p, &v, sizeof(T));
  }

  // mbarrier
  void mbarrier_init(uint64_t* bar, int count) const;
  void fence_barrier_init() const;
  void mbarrier_arrive(uint64_t* bar) const;
  void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) const;
  void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) const;
  bool mbarrier_try_wait(uint64_t* bar, uint32_t parity) const;  // yields when false
  void mbarrier_wait(uint64_t* bar, uint32_t parity) const;

  // TMA: the box at (c0, c1, c2) of `map` into shared memory, completing on `bar`.
  void tma_load_3d(void* smem_dst, const TensorMap* map, int c0, int c1, int c2,
                   uint64_t* bar) const;
  void tma_load(void* smem_dst, const TensorMap* map, const int* coords, uint64_t* bar) const;

  // cp.async: `bytes` (4, 8, 16) from global, of which src_bytes are read and the rest zeroed.
  void cp_async(void* smem_dst, const void* gmem_src, int bytes, int src_bytes) const;
  void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) const {
    cp_async(smem_dst, gmem_src, 16, valid ? 16 : 0);
  }
  void cp_async_commit() const;
  void cp_async_wait(int newest_pending) const;
  template <int N>
  void cp_async_wait() const {
    cp_async_wait(N);
  }
  void cp_async_wait_all() const;
  // The thread's cp.async copies (every one not waited for) arrive on `bar` once complete,
  // without the thread waiting; noinc: that arrival is one of the barrier's expected count.
  void cp_async_mbarrier_arrive_noinc(uint64_t* bar) const;

  void fence_proxy_async() const;
  void named_barrier_sync(int id, int threads) const;
  void named_barrier_arrive(int id, int threads) const;
  // bar.red.or.pred: bar.sync that also returns whether any participant passed true.
  bool named_barrier_red_or(int id, int threads, bool pred) const;
  void sync_threads() const;

  void setmaxnreg(bool inc, int regs) const;
  template <int N>
  void setmaxnreg_inc() const {
    setmaxnreg(true, N);
  }
  template <int N>
  void setmaxnreg_dec() const {
    setmaxnreg(false, N);
  }

  float shfl_xor(float v, int lane_mask) const;
  float shfl(float v, int src_lane) const;
  // bar.warp.sync (__syncwarp) over the full warp: every lane reaches it before any goes on.
  void syncwarp() const;

  void wgmma_fence() const;
  void wgmma_commit() const;
  void wgmma_wait(int pending) const;
  template <int N>
  void wgmma_wait() const {
    wgmma_wait(N);
  }
  // d (+)= A B for m64nNk(32 / elem bytes): A and B from shared memory through descriptors;
  // *_trans: MN-major (16-bit types only).
  template <int NR>
  void wgmma_ss(Acc<NR>& d, WgmmaType ta, WgmmaType tb, uint64_t a_desc, bool a_trans,
                uint64_t b_desc, bool b_trans, bool accumulate) const {
    detail::wgmma_issue(*t_, 2 * NR, ta, tb, a_desc, a_trans, nullptr, b_desc, b_trans, d.raw(),
                        d.track(), accumulate);
  }
  // d += A B with A from registers (the wgmma fragment layout).
  template <int NR>
  void wgmma_rs(Acc<NR>& d, WgmmaType ta, WgmmaType tb, AFrag& a, uint64_t b_desc, bool b_trans,
                bool accumulate = true) const {
    detail::wgmma_issue(*t_, 2 * NR, ta, tb, 0, false, &a, b_desc, b_trans, d.raw(), d.track(),
                        accumulate);
  }

 private:
  void shared_access(const void* p, std::size_t bytes, bool write, const char* what) const;
  detail::ThreadState* t_;
};

// One thread block; its shared memory (aligned to 1024 bytes, filled with 0xff) persists across
// runs. Throws EmulatorError at construction for a launch the hardware refuses.
class Sm90Cta {
 public:
  explicit Sm90Cta(const Sm90Launch& launch);
  // Runs body(Sm90Ops&, unsigned char* smem) as launch.threads fibers; throws EmulatorError when
  // the body broke a rule, or rethrows the first exception a body threw.
  template <class Body>
  void run(Body&& body) {
    unsigned char* const smem = detail::cta_smem(*cta_);
    detail::run_cta(*cta_, [&body, smem](Sm90Ops& ops) { body(ops, smem); });
  }
  unsigned char* smem() { return detail::cta_smem(*cta_); }
  const Sm90Launch& launch() const { return launch_; }
  // The last run's wgmma issues and commits in CTA order (WgmmaEvent).
  const std::vector<WgmmaEvent>& wgmma_log() const { return detail::cta_wgmma_log(*cta_); }

 private:
  Sm90Launch launch_;
  std::unique_ptr<detail::CtaState, void (*)(detail::CtaState*)> cta_;
};

}  // namespace kvattn::fa3::emu
