// The SM90 CTA emulator (sm90_emulator.h): fibers, the scheduler, and each instruction's rules.
#include "cuda/sm90_emulator.h"

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <exception>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/numeric.h"

// The sanitizers' fiber annotations (gcc defines __SANITIZE_*__, clang has __has_feature).
#if defined(__SANITIZE_ADDRESS__)
#define KVATTN_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define KVATTN_EMU_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVATTN_EMU_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define KVATTN_EMU_TSAN 1
#endif
#endif
#ifdef KVATTN_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef KVATTN_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace kvattn::fa3::emu {

int wgmma_type_bytes(WgmmaType t) { return t == WgmmaType::kBf16 || t == WgmmaType::kF16 ? 2 : 1; }
const char* wgmma_type_name(WgmmaType t) {
  switch (t) {
    case WgmmaType::kBf16:
      return "bf16";
    case WgmmaType::kF16:
      return "f16";
    case WgmmaType::kE4m3:
      return "e4m3";
    case WgmmaType::kE5m2:
      return "e5m2";
  }
  return "?";
}
static float element_value(WgmmaType t, const unsigned char* p) {
  switch (t) {
    case WgmmaType::kBf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return num::bf16_to_f32(h);
    }
    case WgmmaType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return num::f16_to_f32(h);
    }
    case WgmmaType::kE4m3:
      return num::e4m3_to_f32(*p);
    case WgmmaType::kE5m2:
      return num::e5m2_to_f32(*p);
  }
  return 0.0f;
}

int swizzle_span_bytes(Swizzle s) {
  switch (s) {
    case Swizzle::kNone:
      return 16;
    case Swizzle::k32B:
      return 32;
    case Swizzle::k64B:
      return 64;
    case Swizzle::k128B:
      return 128;
  }
  return 16;
}
// Swizzle<B, 4, 3>: the 16-byte chunk index (bits 4 .. 4+B-1) XORed with bits 7 .. 7+B-1.
uint32_t swizzle_address(Swizzle s, uint32_t a) {
  const uint32_t mask = s == Swizzle::k128B  ? 7u
                        : s == Swizzle::k64B ? 3u
                        : s == Swizzle::k32B ? 1u
                                             : 0u;
  return a ^ (((a >> 7) & mask) << 4);
}

MatrixDesc decode_desc(uint64_t bits) {
  MatrixDesc d;
  d.start = uint32_t(bits & 0x3FFFu) << 4;
  d.lbo = uint32_t((bits >> 16) & 0x3FFFu) << 4;
  d.sbo = uint32_t((bits >> 32) & 0x3FFFu) << 4;
  d.base_offset = uint32_t((bits >> 49) & 7u);
  d.layout = Swizzle(uint32_t(bits >> 62) & 3u);
  return d;
}
uint64_t encode_desc(const MatrixDesc& d) {
  return uint64_t((d.start >> 4) & 0x3FFFu) | (uint64_t((d.lbo >> 4) & 0x3FFFu) << 16) |
         (uint64_t((d.sbo >> 4) & 0x3FFFu) << 32) | (uint64_t(d.base_offset & 7u) << 49) |
         (uint64_t(d.layout) << 62);
}

uint32_t desc_address(const MatrixDesc& d, bool mn_major, int mn, int k, int eb) {
  const uint32_t T = uint32_t(16 / eb);  // elements per 16 bytes
  const uint32_t span = uint32_t(swizzle_span_bytes(d.layout));
  const uint32_t umn = uint32_t(mn), uk = uint32_t(k), ueb = uint32_t(eb);
  uint32_t a;
  if (!mn_major) {
    if (d.layout == Swizzle::kNone) {
      a = d.start + (umn % 8) * 16 + (umn / 8) * d.sbo + (uk % T) * ueb + (uk / T) * d.lbo;
    } else {
      a = d.start + (umn % 8) * span + (umn / 8) * d.sbo + uk * ueb;
    }
  } else {
    if (d.layout == Swizzle::kNone) {
      a = d.start + (umn % T) * ueb + (umn / T) * d.sbo + (uk % 8) * 16 + (uk / 8) * d.lbo;
    } else {
      const uint32_t row = span / ueb;  // elements along MN in one swizzled row
      a = d.start + (umn % row) * ueb + (umn / row) * d.lbo + (uk % 8) * span + (uk / 8) * d.sbo;
    }
  }
  return swizzle_address(d.layout, a);
}

// ---------------------------------------------------------------------------------------------
// Tensor maps.

uint32_t TensorMap::box_bytes() const {
  uint32_t n = uint32_t(elem_bytes);
  for (int i = 0; i < rank; ++i) n *= box[i];
  return n;
}

namespace {
[[noreturn]] void encode_error(const std::string& what) {
  throw EmulatorError("cuTensorMapEncodeTiled: " + what);
}
}  // namespace

TensorMap encode_tensor_map_tiled(WgmmaType type, int rank, const void* global,
                                  const uint64_t* dims, const uint64_t* strides,
                                  const uint32_t* box, const uint32_t* elem_strides,
                                  Swizzle swizzle) {
  TensorMap m;
  m.type = type;
  m.elem_bytes = wgmma_type_bytes(type);
  if (rank < 1 || rank > 5) encode_error("tensorRank " + std::to_string(rank) + " not in 1..5");
  m.rank = rank;
  if (global == nullptr || reinterpret_cast<uintptr_t>(global) % 16 != 0) {
    encode_error("globalAddress must be 16-byte aligned");
  }
  m.global = global;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 1 || dims[i] > (uint64_t(1) << 32)) {
      encode_error("globalDim[" + std::to_string(i) + "] = " + std::to_string(dims[i]) +
                   " not in 1..2^32");
    }
    m.dims[i] = dims[i];
    if (box[i] < 1 || box[i] > 256) {
      encode_error("boxDim[" + std::to_string(i) + "] = " + std::to_string(box[i]) +
                   " not in 1..256");
    }
    m.box[i] = box[i];
    if (elem_strides[i] < 1 || elem_strides[i] > 8) {
      encode_error("elementStrides[" + std::to_string(i) +
                   "] = " + std::to_string(elem_strides[i]) + " not in 1..8");
    }
    if (elem_strides[i] != 1) encode_error("elementStrides other than 1: not modelled");
  }
  m.strides[0] = uint64_t(m.elem_bytes);
  for (int i = 1; i < rank; ++i) {
    const uint64_t s = strides[i - 1];
    if (s % 16 != 0) {
      encode_error("globalStrides[" + std::to_string(i - 1) + "] = " + std::to_string(s) +
                   " bytes is not a multiple of 16");
    }
    if (s >= (uint64_t(1) << 40)) {
      encode_error("globalStrides[" + std::to_string(i - 1) + "] = " + std::to_string(s) +
                   " is not below 2^40");
    }
    m.strides[i] = s;
  }
  const uint32_t inner = box[0] * uint32_t(m.elem_bytes);
  if (inner % 16 != 0) {
    encode_error("boxDim[0] * elementSize = " + std::to_string(inner) +
                 " bytes is not a multiple of 16 (interleave NONE)");
  }
  if (swizzle != Swizzle::kNone && inner > uint32_t(swizzle_span_bytes(swizzle))) {
    encode_error("boxDim[0] * elementSize = " + std::to_string(inner) + " bytes exceeds the " +
                 std::to_string(swizzle_span_bytes(swizzle)) + "-byte swizzle span");
  }
  m.swizzle = swizzle;
  return m;
}

// ---------------------------------------------------------------------------------------------
// The CTA.

namespace detail {

namespace {
struct Cancelled {};  // unwinds a fiber's stack when the run is abandoned
}  // namespace

struct CpCopy {
  uint32_t dst;
  const unsigned char* src;
  int bytes, src_bytes;
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
};

struct TmaCopy {
  uint32_t dst;
  TensorMap map;
  int coords[5];
  uint32_t bar;
  int thread;
};

thread_local ThreadState* g_current = nullptr;
ThreadState* current_thread() { return g_current; }

std::string warp_name(int thread) {
  return "warp " + std::to_string(thread / 32) + " (warpgroup " + std::to_string(thread / 128) +
         ", thread " + std::to_string(thread) + ")";
}
std::string hex(uint64_t v) {
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
  std::deque<TmaCopy> tma;
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
        fail(reader, instr,
             "async-proxy read of shared byte " + hex(off + i) +
                 ", written through the generic "
                 "proxy by " +
                 warp_name(writer[off + i] - 1) +
                 " with no fence.proxy.async since (the write may not be visible to wgmma/TMA)");
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

void CtaState::switch_to(ThreadState& t) {
  g_current = &t;
#ifdef KVATTN_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, t.stack + 4096, t.map_bytes - 4096);
#endif
#ifdef KVATTN_EMU_TSAN
  __tsan_switch_to_fiber(t.tsan_fiber, 0);
#endif
  swapcontext(&sched_ctx, &t.ctx);
#ifdef KVATTN_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  g_current = nullptr;
}

void CtaState::yield_to_scheduler(ThreadState& t) {
#ifdef KVATTN_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(t.done ? nullptr : &fake, t.cta->sched_stack,
                                 t.cta->sched_stack_bytes);
#endif
#ifdef KVATTN_EMU_TSAN
  __tsan_switch_to_fiber(sched_tsan, 0);
#endif
  swapcontext(&t.ctx, &sched_ctx);
#ifdef KVATTN_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  g_current = &t;
  if (t.cancel) throw Cancelled{};
}

namespace {
thread_local ThreadState* g_starting = nullptr;

void fiber_main() {
  ThreadState& t = *g_starting;
  CtaState& cta = *t.cta;
#ifdef KVATTN_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &cta.sched_stack, &cta.sched_stack_bytes);
#endif
  if (!t.cancel) {
    try {
      Sm90Ops ops(&t);
      (*cta.body)(ops);
      // Exit rules: nothing of this thread's left in flight or half-way.
      if (!t.open_copies.empty() || !t.committed_copies.empty()) {
        cta.fail(t, "exit", "cp.async copies not waited for (cp.async.wait_group) at exit");
      }
      const Rendezvous& w = cta.warps[std::size_t(t.id / 32)];
      if (w.arrived > 0) cta.fail(t, "exit", "exits while its warp waits at " + w.op);
      WarpgroupState& g = cta.warpgroups[std::size_t(t.id / 128)];
      if (g.rv.arrived > 0) cta.fail(t, "exit", "exits while its warpgroup waits at " + g.rv.op);
      if (!g.open.empty() || !g.committed.empty()) {
        cta.fail(t, "exit", "wgmma.mma_async not retired by wgmma.wait_group at exit");
      }
    } catch (const Cancelled&) {
    } catch (const EmulatorError& e) {
      if (!cta.failed) {
        cta.failed = true;
        cta.error = e.what();
      }
    } catch (...) {
      if (!cta.failed) {
        cta.failed = true;
        cta.body_error = std::current_exception();
      }
    }
  }
  t.done = true;
  ++cta.epoch;
  cta.yield_to_scheduler(t);  // never resumed
  std::abort();
}
}  // namespace

std::string CtaState::deadlock_report() {
  std::map<std::string, std::vector<int>> by_wait;
  for (auto& t : threads) {
    if (!t.done && t.blocked) by_wait[t.waiting ? t.waiting() : "?"].push_back(t.id);
  }
  std::ostringstream os;
  os << "deadlock: no thread can make progress and no asynchronous copy is in flight;";
  for (auto& [what, ids] : by_wait) {
    std::map<int, int> warps_count;
    for (int id : ids) ++warps_count[id / 32];
    os << "\n  " << what << ": ";
    bool first = true;
    for (auto& [w, n] : warps_count) {
      os << (first ? "" : ", ") << "warp " << w << " (" << n << " threads)";
      first = false;
    }
  }
  return os.str();
}

void CtaState::land_tma() {
  TmaCopy c = tma.front();
  tma.pop_front();
  const TensorMap& m = c.map;
  const uint32_t eb = uint32_t(m.elem_bytes);
  uint32_t idx[5] = {};
  const uint32_t total = m.box_bytes() / eb;
  {  // the box's destination: box_bytes contiguous bytes, permuted inside by the swizzle
    check_write("a TMA load issued by " + warp_name(c.thread), c.dst, m.box_bytes());
  }
  for (uint32_t e = 0; e < total; ++e) {
    uint32_t rem = e;
    bool oob = false;
    uint64_t goff = 0;
    for (int i = 0; i < m.rank; ++i) {
      idx[i] = rem % m.box[i];
      rem /= m.box[i];
      const int64_t g = int64_t(c.coords[i]) + int64_t(idx[i]);
      if (g < 0 || uint64_t(g) >= m.dims[i]) oob = true;
      goff += uint64_t(g) * m.strides[i];
    }
    const uint32_t dst = swizzle_address(m.swizzle, c.dst + e * eb);
    if (oob) {
      std::memset(smem + dst, 0, eb);
    } else {
      std::memcpy(smem + dst, static_cast<const unsigned char*>(m.global) + goff, eb);
    }
    for (uint32_t i = 0; i < eb; ++i) writer[dst + i] = 0;  // written by the async proxy
  }
  auto it = mbars.find(c.bar);
  if (it == mbars.end()) fail("TMA completion: the mbarrier at " + hex(c.bar) + " is gone");
  add_tx(nullptr, it->second, -int64_t(m.box_bytes()), "TMA completion");
  complete_phase_if_done(it->second);
  ++epoch;
}

void CtaState::run(const std::function<void(Sm90Ops&)>& fn) {
  body = &fn;
  failed = false;
  error.clear();
  body_error = nullptr;
  threads.clear();
  threads.resize(std::size_t(launch.threads));
  mbars.clear();
  tma.clear();
  shadows.clear();
  dead.clear();
  for (auto& n : named) n = NamedBar{};
  for (auto& w : warps) w.arrived = 0;
  const int regs = (launch.regs_per_thread + 7) / 8 * 8;
  for (auto& g : warpgroups) {
    g.rv.arrived = 0;
    g.open.clear();
    g.committed.clear();
    g.regs = regs;
    g.inc_wanted = 0;
  }
  reg_pool = kSmRegisters - regs * launch.threads;
  std::fill(writer.begin(), writer.end(), uint16_t(0));
  std::fill(readers.begin(), readers.end(), uint16_t(0));
#ifdef KVATTN_EMU_ASAN
  const std::size_t stack_bytes = std::size_t(launch.fiber_stack_bytes) * 4;
#else
  const std::size_t stack_bytes = std::size_t(launch.fiber_stack_bytes);
#endif
#ifdef KVATTN_EMU_TSAN
  sched_tsan = __tsan_get_current_fiber();
#endif
  for (int i = 0; i < launch.threads; ++i) {
    ThreadState& t = threads[std::size_t(i)];
    t.cta = this;
    t.id = i;
    t.map_bytes = stack_bytes + 4096;
    void* p = mmap(nullptr, t.map_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    mprotect(p, 4096, PROT_NONE);  // guard page: a stack overflow faults
    t.stack = static_cast<unsigned char*>(p);
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = t.stack + 4096;
    t.ctx.uc_stack.ss_size = stack_bytes;
    t.ctx.uc_link = nullptr;
    makecontext(&t.ctx, fiber_main, 0);
#ifdef KVATTN_EMU_TSAN
    t.tsan_fiber = __tsan_create_fiber(0);
#endif
  }
  auto resume = [&](ThreadState& t) {
    if (!t.started) {
      t.started = true;
      g_starting = &t;
    }
    switch_to(t);
  };
  // After each switch: in early-landing mode the TMA loads issued so far land; and the waiters of
  // an mbarrier phase that just completed run before anyone else.
  std::function<void()> after_switch = [&] {
    if (launch.tma_lands_early) {
      while (!tma.empty()) land_tma();
    }
    while (preempt && !failed) {
      preempt = false;
      for (auto& w : threads) {
        if (w.done || !w.blocked || !w.wake()) continue;
        w.blocked = false;
        ++epoch;
        resume(w);
        if (failed) return;
        if (launch.tma_lands_early) {
          while (!tma.empty()) land_tma();
        }
      }
    }
  };
  bool all_done = false;
  while (!all_done && !failed) {
    const uint64_t before = epoch;
    all_done = true;
    try {
      for (auto& t : threads) {
        if (t.done) continue;
        all_done = false;
        if (t.blocked) {
          if (!t.wake()) continue;
          t.blocked = false;
          ++epoch;
        }
        resume(t);
        if (failed) break;
        after_switch();
        if (failed) break;
      }
    } catch (const EmulatorError& e) {  // a wake condition found a broken rule
      failed = true;
      error = e.what();
    }
    if (failed || all_done) break;
    if (epoch == before) {
      try {
        if (!tma.empty()) {
          land_tma();
        } else {
          fail(deadlock_report());
        }
      } catch (const EmulatorError& e) {
        failed = true;
        error = e.what();
      }
    }
  }
  if (!failed && !tma.empty()) {
    failed = true;
    error = "the CTA exits with " + std::to_string(tma.size()) +
            " TMA load(s) in flight (issued by " + warp_name(tma.front().thread) +
            "; nobody waited for their mbarrier)";
  }
  if (failed) {  // unwind every fiber still alive
    for (auto& t : threads) {
      if (t.done) continue;
      t.cancel = true;
      resume(t);
    }
  }
  for (auto& t : threads) {
#ifdef KVATTN_EMU_TSAN
    if (t.tsan_fiber) __tsan_destroy_fiber(t.tsan_fiber);
#endif
    munmap(t.stack, t.map_bytes);
  }
  threads.clear();
  if (body_error) std::rethrow_exception(body_error);
  if (failed) {
    std::fprintf(stderr, "sm90 emulator: %s\n", error.c_str());
    throw EmulatorError(error);
  }
}

// ---- registers
void reg_read(const RegTrack& t, int index) {
  if (t.in_flight > 0) {
    ThreadState* cur = g_current;
    throw EmulatorError((cur ? warp_name(cur->id) : std::string("host")) + " reads " + t.what +
                        " register " + std::to_string(index) +
                        " of a wgmma.mma_async in flight (before the wgmma.wait_group that "
                        "retires it)");
  }
}
void reg_destroyed(RegTrack& t) noexcept {
  ThreadState* cur = g_current;
  if (cur == nullptr) return;
  CtaState& c = *cur->cta;
  c.dead.insert(&t);
  // Unwinding (another failure, or the run's cancellation) is not this fault.
  if (!c.failed && std::uncaught_exceptions() == 0) {
    c.failed = true;
    c.error = warp_name(cur->id) + ": " + t.what +
              " registers go out of scope while a wgmma.mma_async in flight uses them (no "
              "wgmma.wait_group retired it)";
  }
}
void reg_write(RegTrack& t, int index) {
  ThreadState* cur = g_current;
  if (t.in_flight > 0) {
    throw EmulatorError((cur ? warp_name(cur->id) : std::string("host")) + " writes " + t.what +
                        " register " + std::to_string(index) +
                        " of a wgmma.mma_async in flight (before the wgmma.wait_group that "
                        "retires it)");
  }
  if (cur) t.written_at_fence = cur->wgmma_fences;
}

void wgmma_issue(ThreadState& t, int n, WgmmaType ta, WgmmaType tb, uint64_t a_desc, bool a_trans,
                 AFrag* a_regs, uint64_t b_desc, bool b_trans, float* d, RegTrack& d_track,
                 bool accumulate) {
  CtaState& cta = *t.cta;
  const int eb = wgmma_type_bytes(ta);
  char name[160];
  std::snprintf(name, sizeof name, "wgmma.mma_async.m64n%dk%d.f32.%s.%s %s", n, 32 / eb,
                wgmma_type_name(ta), wgmma_type_name(tb), a_regs ? "(A in registers)" : "");
  std::string instr = name;
  if (wgmma_type_bytes(tb) != eb) cta.fail(t, instr, "A and B element sizes differ");
  if (n < 8 || n > 256 || n % 8 != 0)
    cta.fail(t, instr, "N = " + std::to_string(n) + " is not 8..256 in steps of 8");
  if (eb == 1 && (a_trans || b_trans)) {
    cta.fail(t, instr, "FP8 operands must be K-major (no transpose for 8-bit types)");
  }
  if (t.wgmma_fences == 0) cta.fail(t, instr, "no wgmma.fence before the thread's first wgmma");
  if (d_track.written_at_fence == t.wgmma_fences) {
    cta.fail(t, instr, "accumulator registers written since the thread's last wgmma.fence");
  }
  if (a_regs && a_regs->track().written_at_fence == t.wgmma_fences) {
    cta.fail(t, instr, "A-fragment registers written since the thread's last wgmma.fence");
  }
  WarpgroupState& g = cta.warpgroups[std::size_t(t.id / 128)];
  if (d_track.in_flight > 0) {
    // Chaining accumulators through wgmmas in flight is ordered only for the same shape.
    bool same = false;
    auto scan = [&](const std::vector<WgmmaOp>& ops) {
      for (const auto& o : ops) {
        if (o.dt[t.id % 128] == &d_track) same = o.n == n && o.ta == ta;
      }
    };
    for (const auto& grp : g.committed) scan(grp);
    scan(g.open);
    if (!same) cta.fail(t, instr, "accumulator in flight in a wgmma of another shape");
  }
  std::string uniform = instr + " a=" + hex(a_desc) + (a_trans ? "T" : "") + " b=" + hex(b_desc) +
                        (b_trans ? "T" : "") + (accumulate ? " scale-d=1" : " scale-d=0");
  cta.rendezvous(
      t, g.rv, t.id % 128, uniform,
      [&](int m) {
        g.staging.d[m] = d;
        g.staging.dt[m] = &d_track;
        g.staging.af[m] = a_regs;
      },
      [&] {
        WgmmaOp& op = g.staging;
        op.n = n;
        op.ta = ta;
        op.tb = tb;
        op.a = decode_desc(a_desc);
        op.b = decode_desc(b_desc);
        op.a_trans = a_trans;
        op.b_trans = b_trans;
        op.a_regs = a_regs != nullptr;
        op.accumulate = accumulate;
        op.name = instr;
        if ((!op.a_regs && op.a.base_offset != 0) || op.b.base_offset != 0) {
          cta.fail(t, instr, "descriptor base offset != 0: not modelled");
        }
        for (int m = 0; m < 128; ++m) {
          RegTrack* tr = op.dt[m];
          if (tr->in_flight == 0) {
            cta.shadows[tr].assign(op.d[m], op.d[m] + n / 2);
            for (int i = 0; i < n / 2; ++i) op.d[m][i] = std::numeric_limits<float>::quiet_NaN();
          }
          ++tr->in_flight;
          tr->owner = (t.id / 128) * 128 + m;
          if (op.af[m]) ++op.af[m]->track().in_flight;
        }
        op.warpgroup = t.id / 128;
        const int eb2 = wgmma_type_bytes(ta);
        const int K = 32 / eb2;
        auto add = [&](const MatrixDesc& desc, bool trans, int rows) {
          for (int r = 0; r < rows; ++r)
            for (int k = 0; k < K; ++k) {
              const uint32_t a = desc_address(desc, trans, r, k, eb2);
              if (a < cta.smem_bytes) op.chunks.push_back(a / 16);
            }
        };
        if (!op.a_regs) add(op.a, a_trans, 64);
        add(op.b, b_trans, n);
        std::sort(op.chunks.begin(), op.chunks.end());
        op.chunks.erase(std::unique(op.chunks.begin(), op.chunks.end()), op.chunks.end());
        for (uint32_t c : op.chunks) {
          ++cta.readers[c];
          cta.reader_group[c] = uint8_t(op.warpgroup);
        }
        g.open.push_back(op);
        op.chunks.clear();
      });
}

void retire(CtaState& cta, ThreadState& t, const WgmmaOp& op) {
  if (cta.failed) throw Cancelled{};  // e.g. its registers went out of scope
  const int eb = wgmma_type_bytes(op.ta);
  const int K = 32 / eb;
  const int n = op.n;
  const int wg0 = (t.id / 128) * 128;
  std::vector<float> A(std::size_t(64 * K)), B(std::size_t(n * K));
  const std::string instr = op.name + " (retired by wgmma.wait_group)";
  for (int m = 0; m < 64; ++m) {
    for (int k = 0; k < K; ++k) {
      float v;
      if (op.a_regs) {
        // The register fragment (PTX ISA, wgmma A in registers): warp m / 16, g = m % 8,
        // register 2 (k / (K/2)) + (m % 16) / 8, lane 4 g + t.
        const int w = m / 16, g = m % 8, hi_row = (m % 16) / 8;
        const int per = K / 2;  // columns per register pair (8 for 16-bit, 16 for FP8)
        const int r = 2 * (k / per) + hi_row;
        const int within = k % per;  // 0..7 (16-bit) / 0..15 (FP8)
        const int elems = 4 / eb;    // elements in a b32: 2 or 4
        const int tt = within / elems, h = within % elems;
        const int lane = 4 * g + tt;
        const uint32_t reg = op.af[w * 32 + lane]->raw()[r];
        unsigned char bytes[4];
        std::memcpy(bytes, &reg, 4);
        v = element_value(op.ta, bytes + h * eb);
      } else {
        const uint32_t a = desc_address(op.a, op.a_trans, m, k, eb);
        cta.check_async_read(t, instr + " operand A", a, uint32_t(eb));
        v = element_value(op.ta, cta.smem + a);
      }
      A[std::size_t(m * K + k)] = v;
    }
  }
  for (int j = 0; j < n; ++j) {
    for (int k = 0; k < K; ++k) {
      const uint32_t a = desc_address(op.b, op.b_trans, j, k, eb);
      cta.check_async_read(t, instr + " operand B", a, uint32_t(eb));
      B[std::size_t(j * K + k)] = element_value(op.tb, cta.smem + a);
    }
  }
  for (int m = 0; m < 128; ++m) {
    RegTrack* tr = op.dt[m];
    std::vector<float>& sh = cta.shadows[tr];
    const int w = m / 32, lane = m % 32, g = lane / 4, tq = lane % 4;
    for (int i = 0; i < n / 2; ++i) {
      const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * tq + i % 2;
      double s = 0;
      for (int k = 0; k < K; ++k) {
        s += double(A[std::size_t(row * K + k)]) * double(B[std::size_t(col * K + k)]);
      }
      sh[std::size_t(i)] = float((op.accumulate ? double(sh[std::size_t(i)]) : 0.0) + s);
    }
    if (op.af[m]) --op.af[m]->track().in_flight;
    if (--tr->in_flight == 0) {
      std::memcpy(op.d[m], sh.data(), sizeof(float) * std::size_t(n / 2));
      cta.shadows.erase(tr);
    }
  }
  for (uint32_t c : op.chunks) --cta.readers[c];
  (void)wg0;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Sm90Ops.

using detail::CtaState;
using detail::ThreadState;

int Sm90Ops::thread() const { return t_->id; }

uint32_t Sm90Ops::smem_addr(const void* p) const {
  return t_->cta->offset_of(*t_, p, 0, 1, "cvta.to.shared");
}
void Sm90Ops::shared_access(const void* p, std::size_t bytes, bool write, const char* what) const {
  CtaState& c = *t_->cta;
  const uint32_t off = c.offset_of(*t_, p, bytes, bytes, what);
  if (write) c.mark_generic(*t_, off, uint32_t(bytes));
}

void Sm90Ops::mbarrier_init(uint64_t* bar, int count) const {
  CtaState& c = *t_->cta;
  const std::string instr = "mbarrier.init";
  const uint32_t off = c.offset_of(*t_, bar, 8, 8, instr);
  if (count < 1 || count > (1 << 20) - 1) {
    c.fail(*t_, instr, "count " + std::to_string(count) + " not in 1..2^20-1");
  }
  auto it = c.mbars.find(off);
  if (it != c.mbars.end() && (it->second.pending != it->second.count || it->second.tx != 0)) {
    c.fail(*t_, instr,
           "re-initialises the mbarrier at " + detail::hex(off) + " with a phase in progress");
  }
  detail::Mbar m;
  m.count = m.pending = count;
  m.init_thread = t_->id;
  m.init_id = ++c.mbar_inits;
  c.mbars[off] = m;
  std::memset(bar, 0, 8);
  t_->inits.push_back(off);
  ++c.epoch;
}
void Sm90Ops::fence_barrier_init() const {
  CtaState& c = *t_->cta;
  for (uint32_t off : t_->inits) {
    auto it = c.mbars.find(off);
    if (it != c.mbars.end()) it->second.fenced = true;
  }
  t_->inits.clear();
}
void Sm90Ops::mbarrier_arrive(uint64_t* bar) const {
  CtaState& c = *t_->cta;
  detail::Mbar& m = c.mbar(*t_, bar, "mbarrier.arrive");
  --m.pending;
  ++c.epoch;
  c.complete_phase_if_done(m);
  if (c.preempt) c.yield_to_scheduler(*t_);  // still ready: its waiters go first
}
void Sm90Ops::mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) const {
  CtaState& c = *t_->cta;
  detail::Mbar& m = c.mbar(*t_, bar, "mbarrier.expect_tx");
  c.add_tx(t_, m, int64_t(bytes), "mbarrier.expect_tx");
  ++c.epoch;
}
void Sm90Ops::mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) const {
  CtaState& c = *t_->cta;
  detail::Mbar& m = c.mbar(*t_, bar, "mbarrier.arrive.expect_tx");
  c.add_tx(t_, m, int64_t(bytes), "mbarrier.arrive.expect_tx");
  --m.pending;
  ++c.epoch;
  c.complete_phase_if_done(m);
  if (c.preempt) c.yield_to_scheduler(*t_);  // still ready: its waiters go first
}

namespace {
// try_wait.parity P succeeds once the phase of parity P before the current one has completed:
// current phase (completed count) has parity != P. Also checks the waiter did not fall a phase
// behind: the phase it means is the next one of parity P after the last it observed.
bool check_wait(CtaState& c, ThreadState& t, uint64_t* bar, uint32_t parity, bool record) {
  const std::string instr = "mbarrier.try_wait.parity " + std::to_string(parity & 1u);
  detail::Mbar& m = c.mbar(t, bar, instr);
  const uint32_t off = uint32_t(reinterpret_cast<unsigned char*>(bar) - c.smem);
  auto& obs = t.observed[off];
  if (obs.first != m.init_id) obs = {m.init_id, -2};
  int64_t intended = obs.second + 1;
  if (((intended % 2) + 2) % 2 != int64_t(parity & 1u)) ++intended;
  const int64_t last_completed = m.phase - 1;
  if (last_completed > intended) {
    c.fail(t, instr,
           "phase reused early: the thread waits for phase " + std::to_string(intended) +
               " of the mbarrier at " + detail::hex(off) + ", which has already completed phase " +
               std::to_string(last_completed) + " (the parity no longer names its phase)");
  }
  const bool done = (m.phase & 1) != int64_t(parity & 1u);
  if (done && record) obs.second = intended;
  return done;
}
}  // namespace

bool Sm90Ops::mbarrier_try_wait(uint64_t* bar, uint32_t parity) const {
  CtaState& c = *t_->cta;
  const bool done = check_wait(c, *t_, bar, parity, true);
  if (!done) c.yield_to_scheduler(*t_);  // a spin: no progress
  return done;
}
void Sm90Ops::mbarrier_wait(uint64_t* bar, uint32_t parity) const {
  CtaState& c = *t_->cta;
  ThreadState* t = t_;
  if (check_wait(c, *t, bar, parity, true)) return;
  const uint32_t off = uint32_t(reinterpret_cast<unsigned char*>(bar) - c.smem);
  c.block(
      *t, [&c, t, bar, parity] { return check_wait(c, *t, bar, parity, false); },
      [&c, off, parity] {
        const detail::Mbar& m = c.mbars[off];
        return "mbarrier.try_wait.parity " + std::to_string(parity & 1u) + " on the mbarrier at " +
               detail::hex(off) + " (phase " + std::to_string(m.phase) + ", " +
               std::to_string(m.pending) + " of " + std::to_string(m.count) +
               " arrivals pending, tx " + std::to_string(m.tx) + ")";
      });
  check_wait(c, *t, bar, parity, true);
}

void Sm90Ops::tma_load_3d(void* dst, const TensorMap* map, int c0, int c1, int c2,
                          uint64_t* bar) const {
  const int coords[3] = {c0, c1, c2};
  if (map->rank != 3) {
    t_->cta->fail(*t_, "cp.async.bulk.tensor.3d",
                  "the tensor map has rank " + std::to_string(map->rank));
  }
  tma_load(dst, map, coords, bar);
}
void Sm90Ops::tma_load(void* dst, const TensorMap* map, const int* coords, uint64_t* bar) const {
  CtaState& c = *t_->cta;
  const std::string instr = "cp.async.bulk.tensor." + std::to_string(map->rank) + "d";
  if (map->rank < 1 || map->global == nullptr) c.fail(*t_, instr, "not an encoded tensor map");
  const std::size_t align =
      map->swizzle == Swizzle::kNone ? 128 : std::size_t(swizzle_span_bytes(map->swizzle)) * 8;
  const uint32_t off = c.offset_of(*t_, dst, map->box_bytes(), align, instr);
  if (map->swizzle != Swizzle::kNone &&
      map->box[0] * uint32_t(map->elem_bytes) != uint32_t(swizzle_span_bytes(map->swizzle))) {
    c.fail(*t_, instr, "a swizzled box narrower than the swizzle span: not modelled");
  }
  detail::Mbar& m = c.mbar(*t_, bar, instr);
  if (!m.fenced) {
    c.fail(*t_, instr,
           "completes on an mbarrier whose initialisation was not fenced "
           "(fence.mbarrier_init / fence.proxy.async) for the async proxy");
  }
  detail::TmaCopy copy{};
  copy.dst = off;
  copy.map = *map;
  for (int i = 0; i < map->rank; ++i) copy.coords[i] = coords[i];
  copy.bar = uint32_t(reinterpret_cast<unsigned char*>(bar) - c.smem);
  copy.thread = t_->id;
  c.tma.push_back(copy);
  ++c.epoch;
}

void Sm90Ops::cp_async(void* dst, const void* src, int bytes, int src_bytes) const {
  CtaState& c = *t_->cta;
  const std::string instr = "cp.async.ca.shared.global [" + std::to_string(bytes) + "]";
  if (bytes != 4 && bytes != 8 && bytes != 16) {
    c.fail(*t_, instr, "cp-size " + std::to_string(bytes) + " is not 4, 8 or 16");
  }
  if (src_bytes < 0 || src_bytes > bytes) {
    c.fail(*t_, instr, "src-size " + std::to_string(src_bytes) + " not in 0..cp-size");
  }
  const uint32_t off = c.offset_of(*t_, dst, std::size_t(bytes), std::size_t(bytes), instr);
  if (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % uintptr_t(bytes) != 0) {
    c.fail(*t_, instr,
           "global source " + detail::hex(reinterpret_cast<uintptr_t>(src)) + " is not " +
               std::to_string(bytes) + "-byte aligned");
  }
  t_->open_copies.push_back({off, static_cast<const unsigned char*>(src), bytes, src_bytes});
}
void Sm90Ops::cp_async_commit() const {
  t_->committed_copies.push_back(std::move(t_->open_copies));
  t_->open_copies.clear();
}
void Sm90Ops::cp_async_wait(int newest_pending) const {
  CtaState& c = *t_->cta;
  while (int(t_->committed_copies.size()) > newest_pending) {
    t_->cp_landing = true;
    for (const detail::CpCopy& k : t_->committed_copies.front()) {
      if (k.src_bytes > 0) std::memcpy(c.smem + k.dst, k.src, std::size_t(k.src_bytes));
      std::memset(c.smem + k.dst + k.src_bytes, 0, std::size_t(k.bytes - k.src_bytes));
      c.mark_generic(*t_, k.dst, uint32_t(k.bytes));  // cp.async writes through the generic proxy
    }
    t_->committed_copies.pop_front();
    t_->cp_landing = false;
  }
  ++c.epoch;
}
void Sm90Ops::cp_async_wait_all() const {
  cp_async_commit();
  cp_async_wait(0);
}

void Sm90Ops::fence_proxy_async() const {
  CtaState& c = *t_->cta;
  const uint16_t me = uint16_t(t_->id + 1);
  for (auto [off, n] : t_->unfenced) {
    for (uint32_t i = 0; i < n; ++i) {
      if (c.writer[off + i] == me) c.writer[off + i] = 0;
    }
  }
  t_->unfenced.clear();
  for (uint32_t off : t_->inits) {  // also orders mbarrier.init for the async proxy
    auto it = c.mbars.find(off);
    if (it != c.mbars.end()) it->second.fenced = true;
  }
}

namespace {
void named_arrive(CtaState& c, ThreadState& t, int id, int threads, const std::string& instr) {
  if (id < 0 || id > 15) c.fail(t, instr, "barrier id " + std::to_string(id) + " not in 0..15");
  if (threads <= 0 || threads % 32 != 0 || threads > c.launch.threads) {
    c.fail(t, instr,
           "thread count " + std::to_string(threads) +
               " is not a positive multiple of 32 up to the CTA's " +
               std::to_string(c.launch.threads));
  }
  detail::NamedBar& b = c.named[id];
  if (b.arrived == 0) {
    b.count = threads;
  } else if (b.count != threads) {
    c.fail(t, instr,
           "thread count " + std::to_string(threads) + " differs from the " +
               std::to_string(b.count) + " other threads gave in this phase");
  }
  if (t.named_arrived[id] == b.gen + 1) {
    c.fail(t, instr, "the thread arrives twice at barrier " + std::to_string(id) + " in one phase");
  }
  t.named_arrived[id] = b.gen + 1;
  // A barrier orders this thread's earlier mbarrier.init for the others.
  for (auto& [off, m] : c.mbars) {
    if (m.init_thread == t.id) m.visible = true;
  }
  ++c.epoch;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.gen;
  }
}
}  // namespace

void Sm90Ops::named_barrier_arrive(int id, int threads) const {
  named_arrive(*t_->cta, *t_, id, threads,
               "bar.arrive " + std::to_string(id) + ", " + std::to_string(threads));
}
void Sm90Ops::named_barrier_sync(int id, int threads) const {
  CtaState& c = *t_->cta;
  const std::string instr = "bar.sync " + std::to_string(id) + ", " + std::to_string(threads);
  const uint64_t gen = (id >= 0 && id < 16) ? c.named[id].gen : 0;
  named_arrive(c, *t_, id, threads, instr);
  detail::NamedBar* b = &c.named[id];
  c.block(
      *t_, [b, gen] { return b->gen != gen; },
      [b, instr] {
        return instr + " (" + std::to_string(b->arrived) + " of " + std::to_string(b->count) +
               " arrived)";
      });
}
void Sm90Ops::sync_threads() const { named_barrier_sync(0, t_->cta->launch.threads); }

void Sm90Ops::setmaxnreg(bool inc, int regs) const {
  CtaState& c = *t_->cta;
  const std::string instr = std::string("setmaxnreg.") + (inc ? "inc" : "dec") +
                            ".sync.aligned.u32 " + std::to_string(regs);
  detail::WarpgroupState& g = c.warpgroups[std::size_t(t_->id / 128)];
  ThreadState* t = t_;
  c.rendezvous(
      *t_, g.rv, t_->id % 128, instr, [](int) {},
      [&] {
        if (regs < 24 || regs > 256 || regs % 8 != 0) {
          c.fail(*t, instr, "register count not in 24..256 in steps of 8");
        }
        if (inc && regs < g.regs) {
          c.fail(*t, instr, ".inc below the warpgroup's current " + std::to_string(g.regs));
        }
        if (!inc && regs > g.regs) {
          c.fail(*t, instr, ".dec above the warpgroup's current " + std::to_string(g.regs));
        }
        if (!inc) {
          c.reg_pool += (g.regs - regs) * 128;
          g.regs = regs;
        } else {
          g.inc_wanted = regs;
        }
      });
  if (!inc) return;
  detail::WarpgroupState* gp = &g;
  CtaState* cp = &c;
  c.block(
      *t_,
      [gp, cp] { return gp->inc_wanted == 0 || cp->reg_pool >= (gp->inc_wanted - gp->regs) * 128; },
      [instr, cp] {
        return instr + " (waits for registers: " + std::to_string(cp->reg_pool) +
               " free in the SM)";
      });
  if (g.inc_wanted != 0) {
    c.reg_pool -= (g.inc_wanted - g.regs) * 128;
    g.regs = g.inc_wanted;
    g.inc_wanted = 0;
  }
}

float Sm90Ops::shfl_xor(float v, int lane_mask) const {
  CtaState& c = *t_->cta;
  detail::Rendezvous& w = c.warps[std::size_t(t_->id / 32)];
  const int lane = t_->id % 32;
  c.rendezvous(
      *t_, w, lane, "shfl.sync.bfly.b32",
      [&](int l) {
        w.in[l] = v;
        w.arg[l] = lane_mask;
      },
      [&w] {
        for (int l = 0; l < 32; ++l) {
          const int src = l ^ w.arg[l];  // a source past lane 31 leaves the own value
          w.out[l] = w.in[src >= 0 && src < 32 ? src : l];
        }
      });
  return w.out[lane];
}
float Sm90Ops::shfl(float v, int src_lane) const {
  CtaState& c = *t_->cta;
  detail::Rendezvous& w = c.warps[std::size_t(t_->id / 32)];
  const int lane = t_->id % 32;
  c.rendezvous(
      *t_, w, lane, "shfl.sync.idx.b32",
      [&](int l) {
        w.in[l] = v;
        w.arg[l] = src_lane;
      },
      [&w] {
        for (int l = 0; l < 32; ++l) w.out[l] = w.in[w.arg[l] & 31];
      });
  return w.out[lane];
}

void Sm90Ops::wgmma_fence() const {
  CtaState& c = *t_->cta;
  detail::WarpgroupState& g = c.warpgroups[std::size_t(t_->id / 128)];
  ++t_->wgmma_fences;
  c.rendezvous(
      *t_, g.rv, t_->id % 128, "wgmma.fence.sync.aligned", [](int) {}, [] {});
}
void Sm90Ops::wgmma_commit() const {
  CtaState& c = *t_->cta;
  detail::WarpgroupState& g = c.warpgroups[std::size_t(t_->id / 128)];
  c.rendezvous(
      *t_, g.rv, t_->id % 128, "wgmma.commit_group.sync.aligned", [](int) {},
      [&g] {
        g.committed.push_back(std::move(g.open));
        g.open.clear();
      });
}
void Sm90Ops::wgmma_wait(int pending) const {
  CtaState& c = *t_->cta;
  detail::WarpgroupState& g = c.warpgroups[std::size_t(t_->id / 128)];
  ThreadState* t = t_;
  c.rendezvous(
      *t_, g.rv, t_->id % 128, "wgmma.wait_group.sync.aligned " + std::to_string(pending),
      [](int) {},
      [&] {
        while (int(g.committed.size()) > pending) {
          for (const auto& op : g.committed.front()) detail::retire(c, *t, op);
          g.committed.pop_front();
        }
      });
}

Sm90Cta::Sm90Cta(const Sm90Launch& launch) : launch_(launch), cta_(detail::make_cta(launch)) {}

namespace detail {
std::unique_ptr<CtaState, void (*)(CtaState*)> make_cta(const Sm90Launch& launch) {
  return {new CtaState(launch), [](CtaState* c) { delete c; }};
}
unsigned char* cta_smem(CtaState& cta) { return cta.smem; }
void run_cta(CtaState& cta, const std::function<void(Sm90Ops&)>& body) { cta.run(body); }
}  // namespace detail

}  // namespace kvattn::fa3::emu
