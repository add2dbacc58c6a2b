// The SM90 CTA emulator (sm90_emulator.h): the fibers and their scheduler, the registers' rules
// and wgmma (operand layouts and tensor maps: sm90_layouts.cc; the instructions: sm90_ops.cc).
#include "cuda/emulator/sm90_emulator.h"

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
#include "cuda/emulator/sm90_emulator_state.h"
#include "testing/fp8_accumulation.h"

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

// One stored element of a wgmma operand as f32.
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

// ---------------------------------------------------------------------------------------------
// The CTA.

namespace detail {

thread_local ThreadState* g_current = nullptr;
ThreadState* current_thread() { return g_current; }

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

void CtaState::land_cp_arrival() {
  CpArrival a = std::move(cp_arrivals.front());
  cp_arrivals.pop_front();
  auto it = mbars.find(a.bar);
  if (it == mbars.end()) fail("cp.async arrival: the mbarrier at " + hex(a.bar) + " is gone");
  CpLanded landed{{},
                  a.bar,
                  it->second.init_id,
                  it->second.phase,
                  uint16_t(kCpArrivalWriter | uint16_t(a.thread + 1))};
  for (const CpCopy& k : a.copies) {
    check_write("a cp.async issued by " + warp_name(a.thread) + " (landing for an mbarrier)", k.dst,
                uint32_t(k.bytes));
    if (k.src_bytes > 0) std::memcpy(smem + k.dst, k.src, std::size_t(k.src_bytes));
    std::memset(smem + k.dst + k.src_bytes, 0, std::size_t(k.bytes - k.src_bytes));
    for (int i = 0; i < k.bytes; ++i) writer[k.dst + uint32_t(i)] = landed.marker;
    landed.ranges.emplace_back(k.dst, uint32_t(k.bytes));
  }
  if (!landed.ranges.empty()) cp_landed.push_back(std::move(landed));
  --it->second.pending;  // the arrive-on operation, once the copies are complete
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
  cp_arrivals.clear();
  cp_landed.clear();
  shadows.clear();
  dead.clear();
  for (auto& n : named) n = NamedBar{};
  wgmma_log.clear();
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
      while (async_in_flight()) land_async();
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
          while (async_in_flight()) land_async();
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
        if (async_in_flight()) {
          land_async();
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
  if (!failed && !cp_arrivals.empty()) {
    failed = true;
    error = "the CTA exits with " + std::to_string(cp_arrivals.size()) +
            " cp.async.mbarrier.arrive.noinc group(s) in flight (issued by " +
            warp_name(cp_arrivals.front().thread) + "; nobody waited for their mbarrier)";
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
        cta.wgmma_log.push_back(
            {op.a_regs ? WgmmaEvent::kIssueRs : WgmmaEvent::kIssueSs, uint8_t(t.id / 128)});
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
      const float c = op.accumulate ? sh[std::size_t(i)] : 0.0f;
      const float* a = &A[std::size_t(row * K)];
      const float* b = &B[std::size_t(col * K)];
      if (eb == 1) {
        sh[std::size_t(i)] = testing::fp8_mma_sum(c, a, b, K);
      } else {
        double s = 0;
        for (int k = 0; k < K; ++k) s += double(a[k]) * double(b[k]);
        sh[std::size_t(i)] = float(double(c) + s);
      }
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

Sm90Cta::Sm90Cta(const Sm90Launch& launch) : launch_(launch), cta_(detail::make_cta(launch)) {}

namespace detail {
std::unique_ptr<CtaState, void (*)(CtaState*)> make_cta(const Sm90Launch& launch) {
  return {new CtaState(launch), [](CtaState* c) { delete c; }};
}
unsigned char* cta_smem(CtaState& cta) { return cta.smem; }
const std::vector<WgmmaEvent>& cta_wgmma_log(const CtaState& cta) { return cta.wgmma_log; }
void run_cta(CtaState& cta, const std::function<void(Sm90Ops&)>& body) { cta.run(body); }
}  // namespace detail

}  // namespace kvattn::fa3::emu
