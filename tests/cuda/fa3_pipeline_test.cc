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
#include <gtest/gtest.h>

#include <random>
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

}  // namespace
}  // namespace kvattn::fa3::pipe
