// The SM90 CTA emulator's internal state (sm90_emulator.h is the interface): the per-thread,
// per-warpgroup and per-CTA records, shared by sm90_emulator.cc (fibers, scheduler, wgmma) and
// sm90_ops.cc (the instructions).
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cuda/emulator/sm90_emulator.h"

namespace kvattn::fa3::emu {

namespace detail {

struct Cancelled {};  // unwinds a fiber's stack when the run is abandoned

struct CpCopy {
  uint32_t dst;
  const unsigned char* src;
  int bytes, src_bytes;
};

// A thread's cp.async copies handed to an mbarrier by cp.async.mbarrier.arrive.noinc: they land,
// and then arrive on it, when the scheduler lands asynchronous copies (as TMA's).
struct CpArrival {
  std::vector<CpCopy> copies;
  uint32_t bar;
  int thread;
  uint64_t seq;  // issue order among TMA loads and these
};
// The bytes such copies wrote, unfenced for the async proxy until a thread that saw the
// mbarrier phase they arrived on complete executes fence.proxy.async (their writer, which went
// on without waiting, cannot).
inline constexpr uint16_t kCpArrivalWriter = 0x8000;  // | thread + 1 in CtaState::writer
struct CpLanded {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  uint32_t bar;
  uint64_t init_id;
  int64_t phase;  // the phase they arrived on
  uint16_t marker;
};

struct ThreadState {
  CtaState* cta = nullptr;
  int id = 0;
  ucontext_t ctx{};
  unsigned char* stack = nullptr;  // mapping (guard page first)
  std::size_t map_bytes = 0;
  bool started = false, done = false, blocked = false, cancel = false;
  std::function<bool()> wake;
  std::function<std::string()> waiting;  // describes the wait, for a deadlock report
  uint64_t wgmma_fences = 0;
  bool cp_landing = false;
  std::vector<CpCopy> open_copies;
  std::deque<std::vector<CpCopy>> committed_copies;
  std::vector<std::pair<uint32_t, uint32_t>> unfenced;  // generic writes since fence.proxy.async
  std::vector<uint32_t> inits;                          // mbarriers it initialised, unfenced
  std::unordered_map<uint32_t, std::pair<uint64_t, int64_t>> observed;  // bar -> (init, phase)
  uint64_t named_arrived[16] = {};                                      // generation + 1
  void* tsan_fiber = nullptr;
};

struct Rendezvous {
  std::string op;  // instruction and uniform operands of the first arrival
  int first = -1;
  int size = 0;
  int arrived = 0;
  uint64_t gen = 0;
  float in[128] = {}, out[128] = {};
  int arg[128] = {};
};

struct WgmmaOp {
  int n = 0;
  WgmmaType ta{}, tb{};
  MatrixDesc a{}, b{};
  bool a_trans = false, b_trans = false, a_regs = false, accumulate = false;
  std::string name;
  float* d[128] = {};
  RegTrack* dt[128] = {};
  AFrag* af[128] = {};
  std::vector<uint32_t> chunks;  // the 16-byte shared-memory chunks its operands occupy
  int warpgroup = 0;
};

struct WarpgroupState {
  Rendezvous rv;
  WgmmaOp staging;
  std::vector<WgmmaOp> open;
  std::deque<std::vector<WgmmaOp>> committed;
  int regs = 0;
  int inc_wanted = 0;
};

struct Mbar {
  int count = 0, pending = 0;
  int64_t tx = 0;
  int64_t phase = 0;  // completed phases
  int init_thread = -1;
  uint64_t init_id = 0;
  bool fenced = false;   // fence.mbarrier_init (or fence.proxy.async) by its initialiser
  bool visible = false;  // its initialiser passed a named barrier since
};

struct NamedBar {
  int count = 0, arrived = 0;
  uint64_t gen = 0;
  bool or_acc = false;     // bar.red.or: the phase in progress
  bool or_result = false;  // bar.red.or: the last completed phase (read by its waiters)
  bool red = false;        // the phase in progress is bar.red's (set by its first arrival)
};

struct TmaCopy {
  uint32_t dst;
  TensorMap map;
  int coords[5];
  uint32_t bar;
  int thread;
  uint64_t seq;  // issue order among TMA loads and cp.async arrivals
};

extern thread_local ThreadState* g_current;  // the fiber running now

inline std::string warp_name(int thread) {
  return "warp " + std::to_string(thread / 32) + " (warpgroup " + std::to_string(thread / 128) +
         ", thread " + std::to_string(thread) + ")";
}
inline std::string hex(uint64_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

class CtaState {
 public:
  explicit CtaState(const Sm90Launch& l) : launch(l) {
    if (l.threads <= 0 || l.threads % 128 != 0 || l.threads > 1024) {
      throw EmulatorError("launch: " + std::to_string(l.threads) +
                          " threads is not whole warpgroups (a multiple of 128, at most 1024)");
    }
    if (l.smem_bytes > kMaxSmemBytes) {
      throw EmulatorError("launch: " + std::to_string(l.smem_bytes) +
                          " bytes of shared memory exceed the 227 KiB (232448 bytes) of SM90");
    }
    const int regs = (l.regs_per_thread + 7) / 8 * 8;
    if (regs < 24 || regs > 255 || regs * l.threads > kSmRegisters) {
      throw EmulatorError("launch: " + std::to_string(l.regs_per_thread) + " registers x " +
                          std::to_string(l.threads) + " threads do not fit the SM's 65536");
    }
    smem_bytes = l.smem_bytes;
    void* p = nullptr;
    if (posix_memalign(&p, 1024, smem_bytes == 0 ? 1024 : smem_bytes) != 0) throw std::bad_alloc();
    smem = static_cast<unsigned char*>(p);
    std::memset(smem, 0xff, smem_bytes);
    writer.assign(smem_bytes, 0);
    readers.assign((smem_bytes + 15) / 16, 0);
    reader_group.assign((smem_bytes + 15) / 16, 0);
    warpgroups.resize(std::size_t(l.threads / 128));
    warps.resize(std::size_t(l.threads / 32));
    for (auto& w : warps) w.size = 32;
    for (auto& g : warpgroups) {
      g.rv.size = 128;
      g.regs = regs;
    }
    reg_pool = kSmRegisters - regs * l.threads;
  }
  ~CtaState() { std::free(smem); }

  Sm90Launch launch;
  unsigned char* smem = nullptr;
  std::size_t smem_bytes = 0;
  std::vector<uint16_t> writer;       // thread + 1 of an unfenced generic write, per byte
  std::vector<uint16_t> readers;      // per 16-byte chunk: in-flight wgmmas that read it
  std::vector<uint8_t> reader_group;  // the warpgroup of the last of them
  std::vector<ThreadState> threads;
  std::vector<Rendezvous> warps;
  std::vector<WarpgroupState> warpgroups;
  std::unordered_map<uint32_t, Mbar> mbars;
  uint64_t mbar_inits = 0;
  NamedBar named[16];
  std::vector<WgmmaEvent> wgmma_log;  // this run's wgmma issues and commits (WgmmaEvent)
  std::deque<TmaCopy> tma;
  std::deque<CpArrival> cp_arrivals;
  std::vector<CpLanded> cp_landed;
  uint64_t async_seq = 0;
  std::unordered_map<const RegTrack*, std::vector<float>> shadows;
  std::unordered_set<const RegTrack*> dead;  // registers gone out of scope while in flight
  int reg_pool = 0;
  uint64_t epoch = 0;
  ucontext_t sched_ctx{};
  void* sched_tsan = nullptr;
  const void* sched_stack = nullptr;  // the scheduler's stack, for ASan's fiber switches
  std::size_t sched_stack_bytes = 0;
  bool failed = false;
  bool preempt = false;
  std::string error;
  std::exception_ptr body_error;
  const std::function<void(Sm90Ops&)>* body = nullptr;

  [[noreturn]] void fail(const std::string& msg) const { throw EmulatorError(msg); }
  [[noreturn]] void fail(const ThreadState& t, const std::string& instr, const std::string& why) {
    fail(warp_name(t.id) + " at " + instr + ": " + why);
  }

  // ---- shared memory
  uint32_t offset_of(const ThreadState& t, const void* p, std::size_t bytes, std::size_t align,
                     const std::string& instr) {
    const auto* c = static_cast<const unsigned char*>(p);
    if (c < smem || c + bytes > smem + smem_bytes) {
      fail(t, instr,
           "address " + hex(reinterpret_cast<uintptr_t>(p)) + " (+" + std::to_string(bytes) +
               " bytes) is outside the CTA's " + std::to_string(smem_bytes) +
               " bytes of shared memory");
    }
    const uint32_t off = uint32_t(c - smem);
    if (align > 1 && off % align != 0) {
      fail(t, instr,
           "shared address " + hex(off) + " is not " + std::to_string(align) + "-byte aligned");
    }
    return off;
  }
  // A write to shared memory that an in-flight wgmma reads (operands are read until the
  // wgmma.wait_group that retires it: e.g. a K/V slot released to the producer too early).
  void check_write(const std::string& who, uint32_t off, uint32_t bytes) {
    for (uint32_t c = off / 16; c <= (off + bytes - 1) / 16 && c < readers.size(); ++c) {
      if (readers[c] != 0) {
        fail(who + " writes shared byte " + hex(std::max(off, c * 16)) +
             ", an operand of a wgmma.mma_async of warpgroup " + std::to_string(reader_group[c]) +
             " still in flight (operands are read until the wgmma.wait_group that retires it)");
      }
    }
  }
  void mark_generic(ThreadState& t, uint32_t off, uint32_t bytes) {
    check_write(warp_name(t.id) + (t.cp_landing ? " (a cp.async landing)" : " (st.shared)"), off,
                bytes);
    for (uint32_t i = 0; i < bytes; ++i) writer[off + i] = uint16_t(t.id + 1);
    t.unfenced.emplace_back(off, bytes);
  }
  void check_async_read(const ThreadState& reader, const std::string& instr, uint32_t off,
                        uint32_t bytes) {
    if (off + bytes > smem_bytes) {
      fail(reader, instr,
           "operand byte " + hex(off) + " is outside the CTA's " + std::to_string(smem_bytes) +
               " bytes of shared memory");
    }
    for (uint32_t i = 0; i < bytes; ++i) {
      if (writer[off + i] != 0) {
        const uint16_t w = writer[off + i];
        fail(reader, instr,
             "async-proxy read of shared byte " + hex(off + i) +
                 ", written through the generic "
                 "proxy by " +
                 warp_name((w & ~kCpArrivalWriter) - 1) +
                 ((w & kCpArrivalWriter) != 0
                      ? " (a cp.async that arrived on an mbarrier) with no fence.proxy.async by a "
                        "thread that waited for that mbarrier phase"
                      : " with no fence.proxy.async since") +
                 " (the write may not be visible to wgmma/TMA)");
      }
    }
  }

  // ---- scheduling
  void switch_to(ThreadState& t);
  void yield_to_scheduler(ThreadState& t);
  void block(ThreadState& t, std::function<bool()> wake, std::function<std::string()> what) {
    if (failed) throw Cancelled{};
    if (wake()) return;
    t.blocked = true;
    t.wake = std::move(wake);
    t.waiting = std::move(what);
    yield_to_scheduler(t);
  }
  void run(const std::function<void(Sm90Ops&)>& body);
  void land_tma();
  void land_cp_arrival();
  bool async_in_flight() const { return !tma.empty() || !cp_arrivals.empty(); }
  // The oldest TMA load or cp.async arrival lands.
  void land_async() {
    if (!tma.empty() && (cp_arrivals.empty() || tma.front().seq < cp_arrivals.front().seq)) {
      land_tma();
    } else {
      land_cp_arrival();
    }
  }
  std::string deadlock_report();

  // ---- collectives
  template <class OnArrive, class OnComplete>
  void rendezvous(ThreadState& t, Rendezvous& rv, int member, const std::string& op,
                  OnArrive on_arrive, OnComplete on_complete) {
    if (failed) throw Cancelled{};
    if (rv.arrived == 0) {
      rv.op = op;
      rv.first = t.id;
    } else if (rv.op != op) {
      fail(t, op,
           "divergent collective: " + warp_name(rv.first) + " of the same " +
               (rv.size == 32 ? "warp" : "warpgroup") + " is at " + rv.op);
    }
    on_arrive(member);
    ++epoch;
    if (++rv.arrived == rv.size) {
      rv.arrived = 0;
      on_complete();
      ++rv.gen;
      return;
    }
    const uint64_t gen = rv.gen;
    Rendezvous* r = &rv;
    block(
        t, [r, gen] { return r->gen != gen; },
        [r, op] {
          return op + " (" + std::to_string(r->arrived) + " of " + std::to_string(r->size) +
                 " arrived)";
        });
  }

  // ---- mbarrier
  Mbar& mbar(ThreadState& t, const uint64_t* bar, const std::string& instr) {
    const uint32_t off = offset_of(t, bar, 8, 8, instr);
    auto it = mbars.find(off);
    if (it == mbars.end()) fail(t, instr, "mbarrier at " + hex(off) + " was never initialised");
    Mbar& m = it->second;
    if (m.init_thread != t.id && !m.visible) {
      fail(t, instr,
           "mbarrier at " + hex(off) + " initialised by " + warp_name(m.init_thread) +
               " with no barrier (bar.sync) between the init and this use");
    }
    return m;
  }
  void complete_phase_if_done(Mbar& m) {
    if (m.pending == 0 && m.tx == 0) {
      ++m.phase;
      m.pending = m.count;
      ++epoch;
      preempt = true;  // its waiters run next (the adversarial order: they race the arriver)
    }
  }
  void add_tx(const ThreadState* t, Mbar& m, int64_t delta, const std::string& instr) {
    m.tx += delta;
    if (m.tx > (1 << 20) - 1 || m.tx < -((1 << 20) - 1)) {
      const std::string why = "tx-count " + std::to_string(m.tx) + " leaves +-(2^20 - 1)";
      if (t) fail(*t, instr, why);
      fail("TMA completion: " + why);
    }
  }
};

// Reads a retired wgmma's operands and writes its accumulators (sm90_emulator.cc).
void retire(CtaState& cta, ThreadState& t, const WgmmaOp& op);

}  // namespace detail
}  // namespace kvattn::fa3::emu
