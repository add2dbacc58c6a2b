// Shared-memory bank conflicts of one warp-wide access instruction, the usual model of NVIDIA's
// shared memory (SM80 / SM90): 32 banks of 4 bytes, a 4-byte word at byte address a in bank
// (a / 4) % 32. An instruction of w bytes per lane is served in phases of 128 / max(w, 4) lanes
// (w <= 4: the whole warp at once; 8: half warps; 16: quarter warps); a phase takes as many
// wavefronts as the most distinct words any one bank is asked for (lanes reading or writing the
// same word share it). The fewest wavefronts an instruction can take is its number of phases
// with a lane in them: 1, 2 or 4 for a full warp. (Stores of a phase to one word from different
// lanes are one wavefront here too, as the hardware merges them.)
//
// WarpAccessCounter groups the accesses of an emulated CTA's threads into warp instructions: the
// k-th counted access of each lane of a warp is one instruction (the lanes of a warp run the
// same instruction stream; a group whose lanes disagree on the width or kind is counted apart,
// `divergent`, so a test can insist there is none).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace kvattn::fa3::emu {

struct LaneAccess {
  int lane;
  uint32_t addr;  // shared-memory byte address
  int bytes;      // 1, 2, 4, 8 or 16
};

inline int access_phases(int bytes) { return bytes <= 4 ? 1 : bytes / 4; }

// Wavefronts of one warp instruction (every lane's access of the same width).
inline int wavefronts(const std::vector<LaneAccess>& lanes) {
  if (lanes.empty()) return 0;
  const int phases = access_phases(lanes.front().bytes);
  const int per_phase = 32 / phases;
  int total = 0;
  for (int phase = 0; phase < phases; ++phase) {
    std::map<uint32_t, std::set<uint32_t>> words_of_bank;
    for (const LaneAccess& a : lanes) {
      if (a.lane / per_phase != phase) continue;
      const uint32_t first = a.addr / 4, last = (a.addr + uint32_t(a.bytes) - 1) / 4;
      for (uint32_t w = first; w <= last; ++w) words_of_bank[w % 32].insert(w);
    }
    std::size_t most = 0;
    for (const auto& [bank, words] : words_of_bank) most = std::max(most, words.size());
    total += int(most);
  }
  return total;
}

// The fewest wavefronts the lanes present could take: one per phase they occupy.
inline int min_wavefronts(const std::vector<LaneAccess>& lanes) {
  if (lanes.empty()) return 0;
  const int per_phase = 32 / access_phases(lanes.front().bytes);
  std::set<int> phases;
  for (const LaneAccess& a : lanes) phases.insert(a.lane / per_phase);
  return int(phases.size());
}

struct AccessStats {
  int64_t instructions = 0;
  int64_t wavefronts = 0;
  int64_t min_wavefronts = 0;
  int64_t divergent = 0;  // groups whose lanes disagreed on width or kind
};

// Accesses of one CTA (`threads` threads), by kind (0 .. kinds - 1: the caller's classes, e.g.
// which tile a store writes).
class WarpAccessCounter {
 public:
  WarpAccessCounter(int threads, int kinds)
      : next_(std::size_t(threads), 0), stats_(std::size_t(kinds)) {}

  void record(int thread, int kind, uint32_t addr, int bytes) {
    const int64_t seq = next_.at(std::size_t(thread))++;
    Group& g = pending_[{thread / 32, seq}];
    g.kind.insert(kind);
    g.lanes.push_back(LaneAccess{thread % 32, addr, bytes});
    if (g.lanes.size() == 32) {
      finish(g);
      pending_.erase({thread / 32, seq});
    }
  }
  // The instructions some lanes never reached (a lane that exited, or a count that differs).
  void flush() {
    for (auto& [key, g] : pending_) finish(g);
    pending_.clear();
  }
  const AccessStats& stats(int kind) const { return stats_.at(std::size_t(kind)); }

 private:
  struct Group {
    std::set<int> kind;
    std::vector<LaneAccess> lanes;
  };
  void finish(const Group& g) {
    AccessStats& s = stats_.at(std::size_t(*g.kind.begin()));
    const bool same_width = std::all_of(g.lanes.begin(), g.lanes.end(), [&](const LaneAccess& a) {
      return a.bytes == g.lanes.front().bytes;
    });
    if (g.kind.size() != 1 || !same_width) {
      ++s.divergent;
      return;
    }
    ++s.instructions;
    s.wavefronts += wavefronts(g.lanes);
    s.min_wavefronts += min_wavefronts(g.lanes);
  }

  std::vector<int64_t> next_;
  std::map<std::pair<int, int64_t>, Group> pending_;
  std::vector<AccessStats> stats_;
};

}  // namespace kvattn::fa3::emu
