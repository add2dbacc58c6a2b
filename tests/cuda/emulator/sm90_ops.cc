// The SM90 CTA emulator's instructions (sm90_emulator.h's Sm90Ops): shared-memory access,
// mbarrier, TMA, cp.async, proxy fences, named barriers, setmaxnreg, shuffles, wgmma groups.
#include <cstring>
#include <string>

#include "cuda/emulator/sm90_emulator.h"
#include "cuda/emulator/sm90_emulator_state.h"

namespace kvattn::fa3::emu {

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
  copy.seq = ++c.async_seq;
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

void Sm90Ops::cp_async_mbarrier_arrive_noinc(uint64_t* bar) const {
  CtaState& c = *t_->cta;
  const std::string instr = "cp.async.mbarrier.arrive.noinc.shared::cta.b64";
  c.mbar(*t_, bar, instr);
  // Every cp.async the thread issued and has not waited for, committed or not.
  detail::CpArrival a{
      {}, uint32_t(reinterpret_cast<unsigned char*>(bar) - c.smem), t_->id, ++c.async_seq};
  for (auto& group : t_->committed_copies)
    a.copies.insert(a.copies.end(), group.begin(), group.end());
  a.copies.insert(a.copies.end(), t_->open_copies.begin(), t_->open_copies.end());
  t_->committed_copies.clear();
  t_->open_copies.clear();
  c.cp_arrivals.push_back(std::move(a));
  ++c.epoch;
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
  // cp.async bytes that arrived on an mbarrier phase this thread saw complete (mbarrier waits).
  for (auto g = c.cp_landed.begin(); g != c.cp_landed.end();) {
    const auto seen = t_->observed.find(g->bar);
    if (seen == t_->observed.end() || seen->second.first != g->init_id ||
        seen->second.second < g->phase) {
      ++g;
      continue;
    }
    for (auto [off, n] : g->ranges) {
      for (uint32_t i = 0; i < n; ++i) {
        if (c.writer[off + i] == g->marker) c.writer[off + i] = 0;
      }
    }
    g = c.cp_landed.erase(g);
  }
  for (uint32_t off : t_->inits) {  // also orders mbarrier.init for the async proxy
    auto it = c.mbars.find(off);
    if (it != c.mbars.end()) it->second.fenced = true;
  }
}

namespace {
void named_arrive(CtaState& c, ThreadState& t, int id, int threads, const std::string& instr,
                  bool red = false, bool pred = false) {
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
    b.red = red;
  } else if (b.red != red) {
    // PTX ISA (bar.red): it "should not be intermixed with bar.sync or bar.arrive using the same
    // active barrier"; the result is unpredictable.
    c.fail(t, instr,
           std::string("mixes bar.red with bar.sync / bar.arrive in one phase of barrier ") +
               std::to_string(id));
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
  b.or_acc = b.or_acc || pred;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.gen;
    b.or_result = b.or_acc;
    b.or_acc = false;
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
bool Sm90Ops::named_barrier_red_or(int id, int threads, bool pred) const {
  CtaState& c = *t_->cta;
  const std::string instr =
      "bar.red.or.pred " + std::to_string(id) + ", " + std::to_string(threads);
  const uint64_t gen = (id >= 0 && id < 16) ? c.named[id].gen : 0;
  named_arrive(c, *t_, id, threads, instr, true, pred);
  detail::NamedBar* b = &c.named[id];
  c.block(
      *t_, [b, gen] { return b->gen != gen; },
      [b, instr] {
        return instr + " (" + std::to_string(b->arrived) + " of " + std::to_string(b->count) +
               " arrived)";
      });
  // The next phase cannot complete without this thread: or_result is still this phase's.
  return b->or_result;
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

void Sm90Ops::syncwarp() const {
  CtaState& c = *t_->cta;
  detail::Rendezvous& w = c.warps[std::size_t(t_->id / 32)];
  c.rendezvous(
      *t_, w, t_->id % 32, "bar.warp.sync 0xffffffff", [](int) {}, [] {});
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
      [&c, &g, wg = uint8_t(t_->id / 128)] {
        c.wgmma_log.push_back({WgmmaEvent::kCommit, wg});
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

}  // namespace kvattn::fa3::emu
