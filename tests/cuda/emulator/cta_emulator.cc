#include "cuda/emulator/cta_emulator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace kvattn::fa2::emu {
namespace detail {
namespace {

constexpr int kWarpSize = 32;
constexpr std::align_val_t kSmemAlign{128};

// Thrown inside an emulated thread to unwind its body once the CTA has failed.
struct Aborted {};

// "0-15,17,20-23"
std::string ranges(const std::vector<int>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size();) {
    std::size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ids[i]);
    if (j > i) out += '-' + std::to_string(ids[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

// The participants of one collective: a warp or the whole CTA (the barrier), each with its own
// mutex, so that the emulator orders memory (for ThreadSanitizer too) as the hardware does: a warp
// collective between the lanes of its warp, a barrier across the CTA; a body that writes shared
// memory in one warp and reads it in another without a barrier between is a race.
// The slots are double-buffered: the lanes read their results from the phase that just completed
// while the next collective fills the other, and one cannot lap the other because the collective
// after next needs every participant to have arrived at the next one (after reading its results).
struct Rendezvous {
  Rendezvous(std::string label, int first_thread, int participants, bool of_warp)
      : name(std::move(label)),
        first(first_thread),
        n(participants),
        warp(of_warp),
        here(std::size_t(n), 0),
        gone(std::size_t(n), 0) {
    for (auto& s : slots) s.resize(std::size_t(n));
  }
  // "threads 32-47 (lanes 0-15)" for the participants `idx` (indices into the rendezvous).
  std::string who(const std::vector<int>& idx) const {
    std::vector<int> threads;
    for (int i : idx) threads.push_back(first + i);
    std::string s = "threads " + ranges(threads);
    if (warp) s += " (lanes " + ranges(idx) + ")";
    return s;
  }
  std::vector<int> exited() const {
    std::vector<int> idx;
    for (int i = 0; i < n; ++i) {
      if (gone[std::size_t(i)]) idx.push_back(i);
    }
    return idx;
  }
  // "shfl_xor by threads 32-47 (lanes 0-15); not arrived: threads 48-63 (lanes 16-31)". m held.
  std::string by_op() const {
    const std::vector<Slot>& s = slots[phase];
    std::vector<Op> ops;
    for (int i = 0; i < n; ++i) {
      const Op op = s[std::size_t(i)].op;
      if (here[std::size_t(i)] && std::find(ops.begin(), ops.end(), op) == ops.end())
        ops.push_back(op);
    }
    std::string out;
    for (Op op : ops) {
      std::vector<int> idx;
      for (int i = 0; i < n; ++i) {
        if (here[std::size_t(i)] && s[std::size_t(i)].op == op) idx.push_back(i);
      }
      out += std::string(out.empty() ? "" : ", ") + op_name(op) + " by " + who(idx);
    }
    std::vector<int> missing;
    for (int i = 0; i < n; ++i) {
      if (!here[std::size_t(i)]) missing.push_back(i);
    }
    if (!missing.empty()) out += "; not arrived: " + who(missing);
    return out;
  }

  const std::string name;
  const int first, n;
  const bool warp;
  std::mutex m;  // guards the members below but generation
  std::vector<Slot> slots[2];
  std::vector<char> here;  // who has arrived in the current phase
  std::vector<char> gone;  // who has exited
  int arrived = 0, phase = 0, exited_count = 0;
  // Advanced by an RMW when a phase completes or the CTA fails (an RMW, so that a waiter that
  // reads a completion made after a failure also sees the failure: one release sequence).
  std::atomic<uint32_t> generation{0};
};

struct Copy {
  unsigned char* dst;
  unsigned char bytes[16];
};
// One thread's cp.async copies: touched only by that thread (and by run() after the join).
struct ThreadCopies {
  std::vector<Copy> open;                   // issued since the last commit
  std::deque<std::vector<Copy>> committed;  // oldest first, not yet waited for
};

void shfl_xor_compute(Slot* lanes) {
  float in[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) in[l] = lanes[l].value;
  // shfl.sync.bfly with c = 0x1f: a source lane past 31 leaves the lane its own value.
  for (int l = 0; l < kWarpSize; ++l) {
    const uint32_t src = uint32_t(l) ^ uint32_t(lanes[l].arg);
    lanes[l].value = src < uint32_t(kWarpSize) ? in[src] : in[l];
  }
}

void shfl_compute(Slot* lanes) {
  float in[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) in[l] = lanes[l].value;
  // shfl.sync.idx with c = 0x1f: the source lane is b[4:0].
  for (int l = 0; l < kWarpSize; ++l) lanes[l].value = in[uint32_t(lanes[l].arg) & 31u];
}

template <bool kTrans>
void ldmatrix_compute(Slot* lanes) {
  std::array<const uint16_t*, kWarpSize> rows;
  for (int l = 0; l < kWarpSize; ++l) rows[std::size_t(l)] = lanes[l].row;
  const WarpRegs<uint16_t, 4> r = ldmatrix_x4(rows, kTrans);
  for (int l = 0; l < kWarpSize; ++l) {
    for (int i = 0; i < 4; ++i) lanes[l].a[i] = uint32_t(r[l][i][0]) | uint32_t(r[l][i][1]) << 16;
  }
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kNone:
      return "nothing";
    case Op::kSync:
      return "sync";
    case Op::kSyncOr:
      return "sync_or";
    case Op::kShflXor:
      return "shfl_xor";
    case Op::kShfl:
      return "shfl";
    case Op::kLdmatrix:
      return "ldmatrix_x4";
    case Op::kLdmatrixTrans:
      return "ldmatrix_x4_trans";
    case Op::kMmaBf16:
      return "mma<Bf16Format>";
    case Op::kMmaF16:
      return "mma<F16Format>";
  }
  return "?";
}

class CtaState {
 public:
  CtaState(int threads, unsigned char* smem, std::size_t smem_bytes,
           std::chrono::milliseconds watchdog)
      : threads_(threads),
        smem_(smem),
        smem_bytes_(smem_bytes),
        watchdog_(watchdog),
        barrier_("the CTA barrier", 0, threads, false),
        copies_(std::size_t(threads)) {
    for (int w = 0; w < threads / kWarpSize; ++w) {
      warps_.push_back(std::make_unique<Rendezvous>(
          "warp " + std::to_string(w) + " (threads " + std::to_string(w * kWarpSize) + "-" +
              std::to_string(w * kWarpSize + kWarpSize - 1) + ")",
          w * kWarpSize, kWarpSize, true));
    }
  }

  void run(const std::function<void(const EmuOps&)>& body) {
    std::thread dog([this] { watch(); });
    std::vector<std::thread> pool;
    pool.reserve(std::size_t(threads_));
    try {
      for (int t = 0; t < threads_; ++t)
        pool.emplace_back([this, t, &body] { thread_main(t, body); });
    } catch (const std::system_error& e) {
      fail("emulator: could not start thread " + std::to_string(pool.size()) + ": " + e.what());
    }
    for (std::thread& th : pool) th.join();
    {
      std::lock_guard<std::mutex> lk(watch_m_);
      done_ = true;
    }
    watch_cv_.notify_all();
    dog.join();

    if (thrown_) std::rethrow_exception(thrown_);
    if (error_.empty()) error_ = leftover_copies();
    if (!error_.empty()) {
      std::fprintf(stderr, "%s\n", error_.c_str());
      throw EmulatorError(error_);
    }
  }

  // Participant `index` of `r` arrives with its operands in `io` and leaves with its results;
  // the last to arrive checks that all agree on the operation and computes everyone's results
  // (compute; nullptr for the CTA barrier: the OR of the predicates).
  void arrive(Rendezvous& r, int index, Slot& io, WarpCompute compute) {
    std::unique_lock<std::mutex> lk(r.m);
    if (aborted()) throw Aborted{};
    if (r.exited_count > 0) {
      const std::string message = "emulator: " + r.name + ": " + r.who({index}) + " reached " +
                                  op_name(io.op) + " after " + r.who(r.exited()) + " exited";
      lk.unlock();
      fail_and_unwind(message);
    }
    const int phase = r.phase;
    std::vector<Slot>& slots = r.slots[phase];
    slots[std::size_t(index)] = io;
    r.here[std::size_t(index)] = 1;
    const uint32_t generation = r.generation.load(std::memory_order_acquire);
    if (++r.arrived < r.n) {
      const Census c = census_add(1);
      lk.unlock();
      if (c.blocked + c.exited == threads_) report_deadlock();
      // A failure that advanced the generation before it was read above is seen here.
      if (aborted()) throw Aborted{};
      r.generation.wait(generation, std::memory_order_acquire);
      if (aborted()) throw Aborted{};
    } else {
      if (std::any_of(slots.begin(), slots.end(), [&](const Slot& s) { return s.op != io.op; })) {
        const std::string message =
            "emulator: " + r.name + ": the participants are at different collectives: " + r.by_op();
        lk.unlock();
        fail_and_unwind(message);
      }
      if (compute) {
        compute(slots.data());
      } else {
        const bool any =
            std::any_of(slots.begin(), slots.end(), [](const Slot& s) { return s.arg; });
        for (Slot& s : slots) s.arg = any;
      }
      r.arrived = 0;
      r.phase ^= 1;
      std::fill(r.here.begin(), r.here.end(), 0);
      census_add(-(r.n - 1));
      progress_.fetch_add(1, std::memory_order_relaxed);
      r.generation.fetch_add(1, std::memory_order_acq_rel);
      lk.unlock();
      r.generation.notify_all();
    }
    io = slots[std::size_t(index)];
  }

  Rendezvous& warp_of(int thread) { return *warps_[std::size_t(thread / kWarpSize)]; }
  Rendezvous& barrier() { return barrier_; }
  ThreadCopies& copies(int thread) { return copies_[std::size_t(thread)]; }

  // Fails the run unless [p, p + bytes) lies in shared memory and p is 16-byte aligned.
  void check_smem(int thread, const char* what, const void* p, std::size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(smem_);
    if (a >= base && a + bytes <= base + smem_bytes_ && a % 16 == 0) return;
    fail_and_unwind("emulator: thread " + std::to_string(thread) + ": " + what +
                    " at shared-memory offset " + std::to_string(std::ptrdiff_t(a - base)) +
                    (a % 16 ? " (not 16-byte aligned)" : "") + " of " +
                    std::to_string(smem_bytes_) + " bytes");
  }

  [[noreturn]] void fail_and_unwind(std::string message) {
    fail(std::move(message));
    throw Aborted{};
  }

 private:
  // How many threads wait at a collective that has not completed, and how many have exited, in
  // one atomic so that the thread whose arrival (or exit) makes every thread stuck sees it. The
  // accesses are relaxed: a census must not order the threads' memory (only the collectives do).
  struct Census {
    int blocked, exited;
  };
  static constexpr uint64_t kOneExited = uint64_t(1) << 32;
  Census census_add(int64_t delta) {
    const uint64_t c =
        census_.fetch_add(uint64_t(delta), std::memory_order_relaxed) + uint64_t(delta);
    return {int(uint32_t(c)), int(c >> 32)};
  }

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  void thread_main(int t, const std::function<void(const EmuOps&)>& body) {
    const EmuOps ops(this, t);
    try {
      body(ops);
    } catch (const Aborted&) {
    } catch (...) {
      std::string what = "an exception";
      try {
        throw;
      } catch (const std::exception& e) {
        what = std::string("an exception: ") + e.what();
      } catch (...) {
      }
      fail("emulator: thread " + std::to_string(t) + " threw " + what, std::current_exception());
    }
    // The warp, then the barrier (one lock at a time): a participant that arrived before this
    // exit is named here, one that arrives after it in arrive().
    const std::string gone =
        "emulator: thread " + std::to_string(t) + " exited while others wait for it at ";
    std::string message;
    for (Rendezvous* r : {&warp_of(t), &barrier_}) {
      std::lock_guard<std::mutex> lk(r->m);
      const int index = t - r->first;
      r->gone[std::size_t(index)] = 1;
      ++r->exited_count;
      if (message.empty() && r->arrived > 0) message = gone + r->name + ": " + r->by_op();
    }
    const Census c = census_add(int64_t(kOneExited));
    if (aborted()) return;
    if (!message.empty()) {
      fail(message);
    } else if (c.blocked > 0 && c.blocked + c.exited == threads_) {
      report_deadlock();
    }
  }

  // Records the first failure and wakes every waiting thread to unwind (they see aborted_ once
  // their generation moves).
  void fail(std::string message, std::exception_ptr thrown = nullptr) {
    {
      std::lock_guard<std::mutex> lk(error_m_);
      if (!error_.empty()) return;
      error_ = std::move(message);
      thrown_ = thrown;
    }
    aborted_.store(true, std::memory_order_release);
    for (Rendezvous* r : all()) {
      r->generation.fetch_add(1, std::memory_order_acq_rel);
      r->generation.notify_all();
    }
  }

  // Every live thread waits at a collective that cannot complete: nothing moves any more, so
  // the rendezvous are read one at a time.
  [[noreturn]] void report_deadlock() {
    fail_and_unwind(
        "emulator deadlock: every live thread waits at a collective that cannot complete: " +
        describe());
  }

  std::vector<Rendezvous*> all() {
    std::vector<Rendezvous*> out{&barrier_};
    for (auto& w : warps_) out.push_back(w.get());
    return out;
  }

  // Where every thread is: each collective with arrivals, the exited threads, the rest. Takes
  // the rendezvous' locks one at a time (the caller holds none).
  std::string describe() {
    std::string out;
    std::vector<char> waiting(std::size_t(threads_), 0);
    std::vector<int> exited, running;
    for (Rendezvous* r : all()) {
      std::lock_guard<std::mutex> lk(r->m);
      if (r == &barrier_) exited = r->exited();
      if (r->arrived == 0) continue;
      out += r->name + ": " + r->by_op() + ". ";
      for (int i = 0; i < r->n; ++i) {
        if (r->here[std::size_t(i)]) waiting[std::size_t(r->first + i)] = 1;
      }
    }
    for (int t = 0; t < threads_; ++t) {
      if (!waiting[std::size_t(t)] && !std::binary_search(exited.begin(), exited.end(), t))
        running.push_back(t);
    }
    auto list = [](const std::vector<int>& t) {
      return t.empty() ? "none" : "threads " + ranges(t);
    };
    return out + "Exited: " + list(exited) + ". Running (not in the emulator): " + list(running) +
           ".";
  }

  // A thread left with copies in flight (cp.async issued and never committed, or committed and
  // never waited for) read, or would read, shared memory the copies had not reached.
  std::string leftover_copies() {
    std::string out;
    for (int t = 0; t < threads_; ++t) {
      const ThreadCopies& c = copies_[std::size_t(t)];
      if (c.open.empty() && c.committed.empty()) continue;
      out += (out.empty() ? "emulator: threads exited with cp.async copies in flight: " : "; ") +
             std::string("thread ") + std::to_string(t) + ": " + std::to_string(c.open.size()) +
             " uncommitted, " + std::to_string(c.committed.size()) +
             " committed group(s) not waited for";
    }
    return out;
  }

  // Aborts the process when threads wait and no collective completes for watchdog_: a thread
  // that never arrives (looping, or blocked outside the emulator) would hang the test forever.
  // Reads only the relaxed counters until it reports (taking the rendezvous' locks would order
  // the threads' memory).
  void watch() {
    using Clock = std::chrono::steady_clock;
    const auto step = std::clamp<std::chrono::milliseconds>(
        watchdog_ / 4, std::chrono::milliseconds(1), std::chrono::milliseconds(1000));
    std::unique_lock<std::mutex> lk(watch_m_);
    uint64_t seen = progress_.load(std::memory_order_relaxed);
    Clock::time_point since = Clock::now();
    while (!done_) {
      watch_cv_.wait_for(lk, step);
      if (done_) break;
      const Clock::time_point now = Clock::now();
      const uint64_t progress = progress_.load(std::memory_order_relaxed);
      const bool blocked = uint32_t(census_.load(std::memory_order_relaxed)) > 0;
      if (progress != seen || !blocked || aborted_.load(std::memory_order_relaxed)) {
        seen = progress;
        since = now;
      } else if (now - since >= watchdog_) {
        std::fprintf(stderr, "emulator deadlock: no collective completed for %lld ms: %s\n",
                     static_cast<long long>(watchdog_.count()), describe().c_str());
        std::fflush(stderr);
        std::abort();
      }
    }
  }

  const int threads_;
  unsigned char* const smem_;
  const std::size_t smem_bytes_;
  const std::chrono::milliseconds watchdog_;

  Rendezvous barrier_;
  std::vector<std::unique_ptr<Rendezvous>> warps_;
  std::atomic<uint64_t> census_{0};    // blocked threads (low 32 bits), exited (high 32)
  std::atomic<uint64_t> progress_{0};  // collectives completed
  std::atomic<bool> aborted_{false};

  std::mutex error_m_;  // guards error_ and thrown_ until the threads are joined
  std::string error_;
  std::exception_ptr thrown_;

  std::mutex watch_m_;  // guards done_
  bool done_ = false;
  std::condition_variable watch_cv_;

  std::vector<ThreadCopies> copies_;  // each thread's own
};

void warp_collective(CtaState& cta, int thread, Slot& io, WarpCompute compute) {
  cta.arrive(cta.warp_of(thread), thread % kWarpSize, io, compute);
}

bool cta_barrier(CtaState& cta, int thread, Op op, bool pred) {
  Slot s;
  s.op = op;
  s.arg = pred;
  cta.arrive(cta.barrier(), thread, s, nullptr);
  return s.arg != 0;
}

void cp_async_issue(CtaState& cta, int thread, void* smem, const void* gmem, bool valid) {
  cta.check_smem(thread, "cp_async_16 destination", smem, 16);
  if (valid && reinterpret_cast<uintptr_t>(gmem) % 16 != 0) {
    cta.fail_and_unwind("emulator: thread " + std::to_string(thread) +
                        ": cp_async_16 source not 16-byte aligned");
  }
  Copy c;
  c.dst = static_cast<unsigned char*>(smem);
  // Global memory does not change while the kernel runs, so reading it now is reading it when
  // the copy lands; an invalid copy reads nothing (gmem may point anywhere).
  if (valid) {
    std::memcpy(c.bytes, gmem, sizeof c.bytes);
  } else {
    std::memset(c.bytes, 0, sizeof c.bytes);
  }
  cta.copies(thread).open.push_back(c);
}

void cp_async_commit(CtaState& cta, int thread) {
  ThreadCopies& c = cta.copies(thread);
  c.committed.push_back(std::move(c.open));  // an empty group is a group too
  c.open.clear();
}

void cp_async_wait(CtaState& cta, int thread, int newest_pending) {
  ThreadCopies& c = cta.copies(thread);
  while (c.committed.size() > std::size_t(newest_pending)) {
    for (const Copy& copy : c.committed.front())
      std::memcpy(copy.dst, copy.bytes, sizeof copy.bytes);
    c.committed.pop_front();
  }
}

void run_cta(int threads, unsigned char* smem, std::size_t smem_bytes,
             std::chrono::milliseconds watchdog, const std::function<void(const EmuOps&)>& body) {
  CtaState cta(threads, smem, smem_bytes, watchdog);
  cta.run(body);
}

}  // namespace detail

float EmuOps::shfl_xor(float v, int lane_mask) const {
  detail::Slot s;
  s.op = detail::Op::kShflXor;
  s.value = v;
  s.arg = lane_mask;
  detail::warp_collective(*cta_, thread_, s, &detail::shfl_xor_compute);
  return s.value;
}

float EmuOps::shfl(float v, int src_lane) const {
  detail::Slot s;
  s.op = detail::Op::kShfl;
  s.value = v;
  s.arg = src_lane;
  detail::warp_collective(*cta_, thread_, s, &detail::shfl_compute);
  return s.value;
}

void EmuOps::ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) const {
  load_matrices(r, row, detail::Op::kLdmatrix);
}

void EmuOps::ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) const {
  load_matrices(r, row, detail::Op::kLdmatrixTrans);
}

void EmuOps::load_matrices(uint32_t (&r)[4], const uint16_t* row, detail::Op op) const {
  cta_->check_smem(thread_, detail::op_name(op), row, 16);
  detail::Slot s;
  s.op = op;
  s.row = row;
  detail::warp_collective(*cta_, thread_, s,
                          op == detail::Op::kLdmatrix ? &detail::ldmatrix_compute<false>
                                                      : &detail::ldmatrix_compute<true>);
  std::memcpy(r, s.a, sizeof s.a);
}

Cta::Cta(int threads, std::size_t smem_bytes) : threads_(threads), smem_bytes_(smem_bytes) {
  if (threads <= 0 || threads % detail::kWarpSize != 0 || threads > 1024) {
    throw std::invalid_argument("emu::Cta: threads must be a multiple of 32 in [32, 1024], not " +
                                std::to_string(threads));
  }
  smem_.reset(new (detail::kSmemAlign) unsigned char[std::max<std::size_t>(smem_bytes, 1)]);
  // 0xffff is a NaN in f16 and in bf16: a result that read unwritten shared memory shows it.
  std::memset(smem_.get(), 0xff, smem_bytes);
}

void Cta::AlignedFree::operator()(unsigned char* p) const {
  ::operator delete[](p, detail::kSmemAlign);
}

}  // namespace kvattn::fa2::emu
