// fa3's K/V ring bookkeeping (src/cuda/fa3/kernels/pipeline_state.h) replayed on the CPU against
// an emulated mbarrier (PTX: a phase completes when its expected arrivals are in; try_wait.parity
// P succeeds once the phase of parity P has completed, i.e. while the current phase's parity
// differs from P). A producer and two consumer warpgroups run under random interleavings: every
// consumer reads each block in order from the slot the producer filled for it, and the producer
// never refills a slot that a consumer has not released (phases are never reused early). A
// deliberately wrong start parity must be caught, so the replay can fail. Consumers run as the
// kernel's do: one block at a time (FP8), or with the release one block late (16-bit: the
// softmax of block n overlaps O += P V of block n - 1, whose slot is released after it, so a
// consumer holds two slots: acquire n, release n - 1, acquire n + 1, ...; release the last).
//
// Issue 22 split the ring in two, K and V (full_k / full_v / empty_k / empty_v), with the
// producer's order from pipe::kv_load (16-bit: K(n+1) before V(n)) and the consumers' steps of
// prefill_cta.h's consume(): the same safety under random interleavings, and lookahead: with the
// producer as eager as its barriers let it be, every load a consumer waits for in its iteration
// n + 1 was issued before it released anything in iteration n — which the single K+V ring with a
// release one block late (the order before issue 22) fails.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda/fa3/kernels/pipeline_state.h"

namespace kvattn::fa3::pipe {
namespace {

struct MBarrier {
  int expected = 1;
  int pending = 1;
  uint32_t phase = 0;  // the phase in progress
  void init(int count) { expected = pending = count, phase = 0; }
  void arrive() {
    if (--pending == 0) {
      phase ^= 1u;
      pending = expected;
    }
  }
  bool try_wait(uint32_t parity) const { return phase != parity; }
};

struct Outcome {
  bool ok = true;
  bool finished = false;
  std::string error;
};

// Runs `blocks` K/V blocks through a ring of S slots, producer and `consumers` warpgroups
// advancing one step at a time in random order. producer_parity / consumer_parity: start phases.
template <int S>
Outcome replay(int blocks, int consumers, uint32_t producer_parity, uint32_t consumer_parity,
               std::mt19937& rng, int max_held = 1) {
  MBarrier full[S], empty[S];
  for (int s = 0; s < S; ++s) full[s].init(1), empty[s].init(consumers);
  std::vector<int> slot_block(S, -1);  // which block a slot holds
  std::vector<int> readers(S, 0);      // consumers that acquired the slot and did not release it
  PipelineState<S> prod = producer_start<S>();
  prod.phase = producer_parity;
  // cons: the acquiring state (waits on `full`); rel: the releasing one, behind it by the
  // slots held (the kernel's `prev`). rel.count is the blocks a consumer has released.
  std::vector<PipelineState<S>> cons(consumers, consumer_start<S>());
  for (auto& c : cons) c.phase = consumer_parity;
  std::vector<PipelineState<S>> rel(cons);
  std::vector<int> held(consumers, 0);
  Outcome out;
  int stuck = 0;
  while (stuck < 1000) {
    bool done = prod.count == blocks;
    for (auto& c : rel) done = done && c.count == blocks;
    if (done) {
      out.finished = true;
      return out;
    }
    const int who = int(rng() % (consumers + 1));
    if (who == consumers) {  // producer: wait empty, load, arrive full
      if (prod.count == blocks || !empty[prod.index].try_wait(prod.phase)) {
        ++stuck;
        continue;
      }
      bool released = readers[prod.index] == 0;
      for (const auto& c : rel) released = released && c.count > slot_block[prod.index];
      if (!released) {
        out.ok = false;
        out.error = "producer overwrote slot " + std::to_string(prod.index) + " still in use";
        return out;
      }
      slot_block[prod.index] = prod.count;
      full[prod.index].arrive();
      prod.advance();
    } else {  // consumer: wait full, read (acquire), later release and arrive empty
      PipelineState<S>& c = cons[who];
      if (rel[who].count == blocks) {
        ++stuck;
        continue;
      }
      if (c.count < blocks && held[who] < max_held) {  // the kernel's next step is a wait
        if (!full[c.index].try_wait(c.phase)) {
          ++stuck;
          continue;
        }
        if (slot_block[c.index] != c.count) {
          out.ok = false;
          out.error = "consumer " + std::to_string(who) + " read block " +
                      std::to_string(slot_block[c.index]) + " for block " + std::to_string(c.count);
          return out;
        }
        ++held[who];
        ++readers[c.index];
        c.advance();
      } else {  // release the oldest slot held
        PipelineState<S>& r = rel[who];
        if (slot_block[r.index] != r.count) {
          out.ok = false;
          out.error = "consumer " + std::to_string(who) + " released slot " +
                      std::to_string(r.index) + " holding block " +
                      std::to_string(slot_block[r.index]) + " as block " + std::to_string(r.count);
          return out;
        }
        --held[who];
        --readers[r.index];
        empty[r.index].arrive();
        r.advance();
      }
    }
    stuck = 0;
  }
  return out;  // deadlock: not finished
}

TEST(Fa3Pipeline, RandomInterleavingsNeverReusePhasesEarly) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int blocks = int(rng() % 20);
    const Outcome two = replay<2>(blocks, 2, 1u, 0u, rng);
    ASSERT_TRUE(two.ok) << two.error;
    ASSERT_TRUE(two.finished) << "deadlock, 2 stages, " << blocks << " blocks";
    const Outcome three = replay<3>(blocks, 2, 1u, 0u, rng);
    ASSERT_TRUE(three.ok) << three.error;
    ASSERT_TRUE(three.finished) << "deadlock, 3 stages, " << blocks << " blocks";
  }
}

TEST(Fa3Pipeline, LaggedReleaseOfTheOverlappedConsumer) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int blocks = int(rng() % 20);
    const Outcome two = replay<2>(blocks, 2, 1u, 0u, rng, 2);
    ASSERT_TRUE(two.ok) << two.error;
    ASSERT_TRUE(two.finished) << "deadlock, 2 stages, " << blocks << " blocks";
    const Outcome three = replay<3>(blocks, 2, 1u, 0u, rng, 2);
    ASSERT_TRUE(three.ok) << three.error;
    ASSERT_TRUE(three.finished) << "deadlock, 3 stages, " << blocks << " blocks";
  }
  // A consumer that would hold three slots of a two-slot ring before releasing one never gets
  // its third block: the replay sees the deadlock, so it can fail.
  const Outcome three_held = replay<2>(6, 2, 1u, 0u, rng, 3);
  EXPECT_FALSE(three_held.finished && three_held.ok);
}

TEST(Fa3Pipeline, WrongStartParityIsCaught) {
  std::mt19937 rng(3);
  // Consumers starting at parity 1 would pass a fresh `full` barrier and read an empty slot.
  bool caught = false;
  for (int trial = 0; trial < 50 && !caught; ++trial) {
    const Outcome o = replay<2>(6, 2, 1u, 1u, rng);
    caught = !o.ok || !o.finished;
  }
  EXPECT_TRUE(caught);
  // A producer starting at parity 0 waits for a release that never comes on a fresh ring.
  const Outcome o = replay<2>(6, 2, 0u, 0u, rng);
  EXPECT_FALSE(o.finished && o.ok);
}

TEST(Fa3Pipeline, StateWrapsAndFlipsParity) {
  PipelineState<3> s = producer_start<3>();
  EXPECT_EQ(s.phase, 1u);
  for (int i = 0; i < 7; ++i) s.advance();
  EXPECT_EQ(s.index, 1);
  EXPECT_EQ(s.phase, 1u);  // wrapped twice: flipped twice
  EXPECT_EQ(s.count, 7);
}

// ---- Split K and V rings (issue 22) --------------------------------------------------------

enum Ring { kK = 0, kV = 1, kQ = 2 };
// A producer load or a consumer step on a ring: block `block` (of the tile) of ring `ring`.
struct RingOp {
  int ring;
  int block;
  bool release = false;  // consumer steps: acquire (wait for `full`) or release (arrive `empty`)
};

// The orders under test, per tile of `blocks` blocks. Consumer steps are grouped by iteration (the
// kernel's loop trips; the iteration after the last block holds the last release(s)).
enum class Order {
  // prefill_cta.h, 16-bit: kv_load(k_ahead); acquire V(n-1), K(n), release K(n), V(n-1)
  kSplit16,
  // prefill_cta.h, FP8: kv_load(natural); acquire K(n), V(n), release K(n), V(n)
  kSplitFp8,
  kSplitFp8KAhead,  // the FP8 consumer under the 16-bit load order (why FP8 keeps the natural one)
  kSingleRing,      // before issue 22: one K+V ring, acquire n, release n - 1 (16-bit overlap)
};

std::vector<RingOp> producer_loads(Order order, int blocks) {
  std::vector<RingOp> loads;
  if (order == Order::kSingleRing) {
    for (int n = 0; n < blocks; ++n) loads.push_back({kK, n});
    return loads;
  }
  const bool k_ahead = order != Order::kSplitFp8;
  for (int j = 0; j < 2 * blocks; ++j) {
    const KvLoad l = kv_load(j, blocks, k_ahead);
    loads.push_back({l.v ? kV : kK, l.block});
  }
  return loads;
}

std::vector<std::vector<RingOp>> consumer_iterations(Order order, int blocks) {
  std::vector<std::vector<RingOp>> it;
  if (blocks == 0) return it;
  switch (order) {
    case Order::kSplit16:
      it.push_back({{kK, 0}, {kK, 0, true}});
      for (int n = 1; n < blocks; ++n)
        it.push_back({{kV, n - 1}, {kK, n}, {kK, n, true}, {kV, n - 1, true}});
      it.push_back({{kV, blocks - 1}, {kV, blocks - 1, true}});
      break;
    case Order::kSplitFp8:
    case Order::kSplitFp8KAhead:
      for (int n = 0; n < blocks; ++n)
        it.push_back({{kK, n}, {kV, n}, {kK, n, true}, {kV, n, true}});
      break;
    case Order::kSingleRing:
      it.push_back({{kK, 0}});
      for (int n = 1; n < blocks; ++n) it.push_back({{kK, n}, {kK, n - 1, true}});
      it.push_back({{kK, blocks - 1, true}});
      break;
  }
  return it;
}

// Where the Q copies of a tile are (prefill_cta.h's produce_q; none: Q not modelled). Consumers
// wait for their Q (full_q) before the tile's first step and release it (empty_q) after its last,
// the epilogue staging O in the Q tile; a tile with no block still takes its Q and releases it.
enum class QPlacement {
  kNone,
  // The Q warp walks the tiles on its own (the 16-bit TMA path: warp 3 is free).
  kOwnWarp,
  // In the K/V producer's walk, before each tile's loads (FP8 and 16-bit (256, 256) by cp.async:
  // the Q warp copies K/V too, and the later place spilled there).
  kTileStart,
  // In the walk after the loads of the tile's first S blocks, the last loads that need only
  // earlier tiles' releases (16-bit cp.async at 128-key blocks; FP8 by TMA, its V transposes).
  kAfterFirstBlocks,
};

struct RingOutcome {
  bool ok = true;         // no slot read before its load, none overwritten while in use
  bool finished = false;  // no deadlock
  bool lookahead = true;  // every wait's load issued before the previous iteration's first release
  std::string error, lookahead_error;
};

// A CTA's tiles (blocks per tile) through the two rings of S slots: the producer and `consumers`
// warpgroups. random: each step picks an actor at random; otherwise rounds in which the producer
// issues every load its barriers allow, then each consumer takes one step (the eager schedule
// that the lookahead is measured under).
template <int S>
RingOutcome replay_rings(Order order, const std::vector<int>& tiles, int consumers, bool random,
                         std::mt19937& rng, QPlacement q = QPlacement::kNone) {
  MBarrier full[2][S], empty[2][S];
  for (int r = 0; r < 2; ++r)
    for (int s = 0; s < S; ++s) full[r][s].init(1), empty[r][s].init(consumers);
  // The Q pair of each consumer warpgroup (one slot: one arrival each way in the model).
  std::vector<MBarrier> full_q(static_cast<size_t>(consumers)), empty_q(full_q);
  for (auto& m : full_q) m.init(1);
  for (auto& m : empty_q) m.init(1);
  // The global sequences: loads (ring, use number; Q: the tile and its consumer), consumer
  // iterations.
  struct Load {
    int ring, use;
    int consumer = -1;
  };
  struct Step {
    int ring, use;
    bool release;
  };
  std::vector<Load> loads, q_loads;  // q_loads: the Q warp's own walk (kOwnWarp)
  std::vector<std::vector<Step>> iterations;
  int base = 0;
  const bool k_ahead = order != Order::kSplitFp8;
  for (size_t k = 0; k < tiles.size(); ++k) {
    const int blocks = tiles[k];
    const std::vector<RingOp> kv = producer_loads(order, blocks);
    const int q_at = q == QPlacement::kTileStart ? 0
                     : q == QPlacement::kAfterFirstBlocks
                         ? (blocks <= S ? 2 * blocks : (k_ahead ? 2 * S - 1 : 2 * S))
                         : -1;
    const auto push_q = [&](std::vector<Load>& to) {
      for (int c = 0; c < consumers; ++c) to.push_back({kQ, int(k), c});
    };
    for (size_t j = 0; j <= kv.size(); ++j) {
      if (int(j) == q_at) push_q(loads);
      if (j < kv.size()) loads.push_back({kv[j].ring, base + kv[j].block});
    }
    if (q == QPlacement::kOwnWarp) push_q(q_loads);
    std::vector<std::vector<Step>> its;
    for (const auto& it : consumer_iterations(order, blocks)) {
      std::vector<Step> steps;
      for (const RingOp& c : it) steps.push_back({c.ring, base + c.block, c.release});
      its.push_back(steps);
    }
    if (q != QPlacement::kNone) {
      if (its.empty()) its.emplace_back();
      its.front().insert(its.front().begin(), Step{kQ, int(k), false});
      its.back().push_back(Step{kQ, int(k), true});  // after the epilogue
    }
    for (auto& it : its) iterations.push_back(std::move(it));
    base += blocks;
  }
  std::vector<int> q_tile(static_cast<size_t>(consumers), -1);  // the tile a Q tile holds
  std::vector<bool> q_held(static_cast<size_t>(consumers), false);
  std::vector<std::vector<int>> slot_use(2, std::vector<int>(S, -1));
  std::vector<std::vector<int>> readers(2, std::vector<int>(S, 0));
  std::vector<long> issued(size_t(2 * base + 2), -1);  // event time of load (ring, use)
  const auto at = [](int ring, int use) { return size_t(2 * use + ring); };
  PipelineState<S> prod[2] = {producer_start<S>(), producer_start<S>()};
  size_t next_load = 0, next_q_load = 0;
  struct Consumer {
    size_t iteration = 0, step = 0;
    PipelineState<S> acq[2] = {consumer_start<S>(), consumer_start<S>()};
    PipelineState<S> rel[2] = {consumer_start<S>(), consumer_start<S>()};
    std::vector<long> first_release;  // per iteration
  };
  std::vector<Consumer> cons(static_cast<size_t>(consumers));
  long now = 0;
  RingOutcome out;
  const auto fail = [&](const std::string& e) {
    out.ok = false;
    out.error = e;
    return out;
  };
  // A Q copy for tile l.use into consumer l.consumer's Q tile once it released the previous one.
  const auto copy_q = [&](const Load& l) -> bool {
    const size_t c = static_cast<size_t>(l.consumer);
    if (!empty_q[c].try_wait(q_producer_parity(l.use))) return false;
    if (q_held[c]) {
      fail("Q of tile " + std::to_string(l.use) + " copied over consumer " + std::to_string(c) +
           "'s Q still in use");
      return false;
    }
    q_tile[c] = l.use;
    full_q[c].arrive();
    return true;
  };
  const auto produce_q = [&]() -> bool {
    if (next_q_load == q_loads.size() || !copy_q(q_loads[next_q_load])) return false;
    ++next_q_load;
    ++now;
    return true;
  };
  // One producer load if its barrier lets it; false otherwise.
  const auto produce = [&]() -> bool {
    if (next_load == loads.size()) return false;
    const Load l = loads[next_load];
    if (l.ring == kQ) {
      if (!copy_q(l)) return false;
      ++next_load;
      ++now;
      return true;
    }
    PipelineState<S>& st = prod[l.ring];
    if (!empty[l.ring][st.index].try_wait(st.phase)) return false;
    if (readers[l.ring][st.index] != 0) return false;  // checked below as an error
    slot_use[l.ring][st.index] = l.use;
    issued[at(l.ring, l.use)] = now++;
    full[l.ring][st.index].arrive();
    st.advance();
    ++next_load;
    return true;
  };
  // One consumer step if it can take it; false when it waits.
  const auto consume = [&](Consumer& c) -> bool {
    if (c.iteration == iterations.size()) return false;
    const Step& s = iterations[c.iteration][c.step];
    const size_t ci = static_cast<size_t>(&c - cons.data());
    if (s.ring == kQ && !s.release) {
      if (!full_q[ci].try_wait(q_consumer_parity(s.use))) return false;
      if (q_tile[ci] != s.use) {
        fail("consumer " + std::to_string(ci) + " read Q of tile " + std::to_string(q_tile[ci]) +
             " for tile " + std::to_string(s.use));
        return false;
      }
      q_held[ci] = true;
    } else if (s.ring == kQ) {
      q_held[ci] = false;
      empty_q[ci].arrive();
      if (c.first_release.size() == c.iteration) c.first_release.push_back(now);
    } else if (!s.release) {
      PipelineState<S>& st = c.acq[s.ring];
      if (!full[s.ring][st.index].try_wait(st.phase)) return false;
      if (slot_use[s.ring][st.index] != s.use) {
        fail("ring " + std::to_string(s.ring) + " use " + std::to_string(s.use) + " read use " +
             std::to_string(slot_use[s.ring][st.index]));
        return false;
      }
      if (c.iteration > 0 && issued[at(s.ring, s.use)] > c.first_release[c.iteration - 1] &&
          out.lookahead) {
        out.lookahead = false;
        out.lookahead_error = "iteration " + std::to_string(c.iteration) + " waits for ring " +
                              std::to_string(s.ring) + " use " + std::to_string(s.use) +
                              ", issued after a release of iteration " +
                              std::to_string(c.iteration - 1);
      }
      ++readers[s.ring][st.index];
      st.advance();
    } else {
      PipelineState<S>& st = c.rel[s.ring];
      if (slot_use[s.ring][st.index] != s.use) {
        fail("ring " + std::to_string(s.ring) + " released use " + std::to_string(s.use) +
             " from a slot holding " + std::to_string(slot_use[s.ring][st.index]));
        return false;
      }
      --readers[s.ring][st.index];
      empty[s.ring][st.index].arrive();
      st.advance();
      if (c.first_release.size() == c.iteration) c.first_release.push_back(now);
    }
    ++now;
    if (++c.step == iterations[c.iteration].size()) {
      if (c.first_release.size() == c.iteration) c.first_release.push_back(now);
      ++c.iteration, c.step = 0;
    }
    return true;
  };
  // A producer whose empty wait passes while readers remain overwrote a slot in use.
  const auto overwrite = [&]() {
    if (next_load == loads.size()) return false;
    const Load l = loads[next_load];
    if (l.ring == kQ) return false;  // copy_q checks its own
    const PipelineState<S>& st = prod[l.ring];
    return empty[l.ring][st.index].try_wait(st.phase) && readers[l.ring][st.index] != 0;
  };
  int stuck = 0;
  while (stuck < (random ? 1000 : 2)) {
    bool done = next_load == loads.size() && next_q_load == q_loads.size();
    for (const Consumer& c : cons) done = done && c.iteration == iterations.size();
    if (done) {
      out.finished = true;
      return out;
    }
    bool moved = false;
    if (random) {
      const int who = int(rng() % unsigned(consumers + 2));
      moved = who == consumers       ? produce()
              : who == consumers + 1 ? produce_q()
                                     : consume(cons[size_t(who)]);
    } else {
      while (produce()) moved = true;
      while (produce_q()) moved = true;
      for (Consumer& c : cons) moved = consume(c) || moved;
    }
    if (!out.ok) return out;
    if (overwrite()) return fail("producer overwrote a slot still in use");
    stuck = moved ? 0 : stuck + 1;
  }
  return out;  // deadlock: not finished
}

std::vector<int> random_tiles(std::mt19937& rng) {
  std::vector<int> tiles(1 + rng() % 3);
  for (int& b : tiles) b = int(rng() % 8);
  return tiles;
}

TEST(Fa3Pipeline, SplitRingsNeverReusePhasesEarly) {
  std::mt19937 rng(17);
  for (Order order : {Order::kSplit16, Order::kSplitFp8, Order::kSingleRing}) {
    for (int trial = 0; trial < 1000; ++trial) {
      const std::vector<int> tiles = random_tiles(rng);
      const RingOutcome two = replay_rings<2>(order, tiles, 2, true, rng);
      ASSERT_TRUE(two.ok) << two.error;
      ASSERT_TRUE(two.finished) << "deadlock, 2 stages, order " << int(order);
      const RingOutcome three = replay_rings<3>(order, tiles, 2, true, rng);
      ASSERT_TRUE(three.ok) << three.error;
      ASSERT_TRUE(three.finished) << "deadlock, 3 stages, order " << int(order);
      // One consumer warpgroup (params.h's consumer_warpgroups = 1: tiles of 64 rows).
      const RingOutcome one = replay_rings<2>(order, tiles, 1, true, rng);
      ASSERT_TRUE(one.ok) << one.error;
      ASSERT_TRUE(one.finished) << "deadlock, 1 consumer, order " << int(order);
    }
  }
}

// The lookahead of fa3's two-stage rings: when a consumer waits for a block's K or V, that load
// was issued before the consumer released anything in the iteration before — so the load
// overlaps a whole iteration of compute. The order before issue 22 (one K+V ring, released a
// block late) fails it: block n + 1's load could start only after iteration n released slot
// n - 1.
TEST(Fa3Pipeline, NextBlocksLoadIssuedBeforeTheIterationReleasesAnything) {
  std::mt19937 rng(23);
  for (const std::vector<int>& tiles :
       std::vector<std::vector<int>>{{1}, {2}, {3}, {8}, {5, 1, 4}, {2, 2, 2}, {7, 0, 3}}) {
    for (Order order : {Order::kSplit16, Order::kSplitFp8}) {
      for (int consumers : {2, 1}) {  // 1: params.h's consumer_warpgroups = 1 (64-row tiles)
        const RingOutcome o = replay_rings<2>(order, tiles, consumers, false, rng);
        ASSERT_TRUE(o.ok && o.finished) << o.error;
        EXPECT_TRUE(o.lookahead) << "order " << int(order) << ", " << consumers
                                 << " consumers: " << o.lookahead_error;
      }
    }
  }
  for (Order order : {Order::kSingleRing, Order::kSplitFp8KAhead}) {
    for (int consumers : {2, 1}) {
      const RingOutcome o = replay_rings<2>(order, {8}, consumers, false, rng);
      ASSERT_TRUE(o.ok && o.finished) << o.error;
      EXPECT_FALSE(o.lookahead) << "order " << int(order) << ", " << consumers
                                << " consumers, has the lookahead it should lack";
    }
  }
}

// The Q pair across tiles (prefill_cta.h's full_q / empty_q): a consumer warpgroup waits for its
// Q before a tile's first step and releases it after the tile's epilogue (which stages O in the
// Q tile), and the Q warp copies the next tile's Q once it is released. Under random
// interleavings, for every placement of the copies: no consumer reads another tile's Q, no copy
// lands on a Q still in use, no deadlock (one or two consumer warpgroups; tiles with no block
// too). Under the eager schedule, the K/V lookahead across tiles holds where the Q warp walks the
// tiles on its own (the 16-bit TMA path) and where the copies follow the tile's first blocks'
// loads (16-bit cp.async at 128-key blocks, FP8 by TMA); with the copies at each tile's start
// (FP8 and 16-bit (256, 256) by cp.async, where the later place spilled) the next tile's first K
// waits for the previous tile's epilogue: the lookahead is lost there, which the check reports.
TEST(Fa3Pipeline, QPairAcrossTiles) {
  std::mt19937 rng(29);
  const QPlacement placements[] = {QPlacement::kOwnWarp, QPlacement::kTileStart,
                                   QPlacement::kAfterFirstBlocks};
  for (QPlacement q : placements) {
    for (Order order : {Order::kSplit16, Order::kSplitFp8}) {
      for (int trial = 0; trial < 500; ++trial) {
        const std::vector<int> tiles = random_tiles(rng);
        for (int consumers : {2, 1}) {
          const RingOutcome o = replay_rings<2>(order, tiles, consumers, true, rng, q);
          ASSERT_TRUE(o.ok) << o.error;
          ASSERT_TRUE(o.finished) << "deadlock, placement " << int(q) << ", order " << int(order)
                                  << ", " << consumers << " consumers";
        }
      }
    }
  }
  for (const std::vector<int>& tiles :
       std::vector<std::vector<int>>{{5, 1, 4}, {2, 2, 2}, {7, 0, 3}, {3, 8}}) {
    for (Order order : {Order::kSplit16, Order::kSplitFp8}) {
      for (int consumers : {2, 1}) {
        for (QPlacement q : placements) {
          const RingOutcome o = replay_rings<2>(order, tiles, consumers, false, rng, q);
          ASSERT_TRUE(o.ok && o.finished) << o.error;
          if (q == QPlacement::kTileStart) {
            EXPECT_FALSE(o.lookahead) << "order " << int(order) << ", " << consumers
                                      << " consumers: Q at the tile start kept the lookahead";
          } else {
            EXPECT_TRUE(o.lookahead) << "placement " << int(q) << ", order " << int(order) << ", "
                                     << consumers << " consumers: " << o.lookahead_error;
          }
        }
      }
    }
  }
}

TEST(Fa3Pipeline, KvLoadOrderAndStateAt) {
  // 16-bit: K(0), K(1), V(0), K(2), V(1), V(2); FP8: K(0), V(0), K(1), V(1), ...
  const int v16[] = {0, 0, 1, 0, 1, 1}, b16[] = {0, 1, 0, 2, 1, 2};
  for (int j = 0; j < 6; ++j) {
    EXPECT_EQ(kv_load(j, 3, true).v, v16[j] == 1) << j;
    EXPECT_EQ(kv_load(j, 3, true).block, b16[j]) << j;
    EXPECT_EQ(kv_load(j, 3, false).v, j % 2 == 1) << j;
    EXPECT_EQ(kv_load(j, 3, false).block, j / 2) << j;
  }
  EXPECT_FALSE(kv_load(0, 1, true).v);
  EXPECT_TRUE(kv_load(1, 1, true).v);
  EXPECT_EQ(kv_load(1, 1, true).block, 0);
  // state_at(start, c) is c advance() calls from start.
  for (uint32_t phase : {0u, 1u}) {
    PipelineState<2> s;
    s.phase = phase;
    const PipelineState<2> start = s;
    for (int c = 0; c < 9; ++c, s.advance()) {
      const PipelineState<2> t = state_at(start, c);
      EXPECT_EQ(t.index, s.index);
      EXPECT_EQ(t.phase, s.phase);
      EXPECT_EQ(t.count, s.count);
    }
  }
}

}  // namespace
}  // namespace kvattn::fa3::pipe
