// The consumer ping-pong of fa3's body (src/cuda/fa3/kernels/consumer_pingpong.h) as an invariant
// over one CTA's wgmma order, the emulator's record of the warpgroups' wgmma issues and commits in
// CTA order (emu::WgmmaEvent). fa3_replay_ctas.h asserts it after every replayed CTA, so every
// replay test checks it; fa3_pingpong_test.cc tests the check itself and counts the turns.
//
// With two computing consumer warpgroups, the order splits into turns: maximal runs of one
// warpgroup's events. The GEMMs of the two warpgroups alternate and never interleave when:
//   - every turn ends with a commit: no warpgroup's GEMM (a wgmma group) is split by the other's
//     issues (interleaving issues is what two free-running warpgroups do);
//   - a turn holds at most one S = Q K^T (a commit group with an ss wgmma: A from shared memory)
//     and at most one block's O += P V (rs wgmmas: P from registers): one GEMM step, so a
//     warpgroup never takes two steps while the other waits (a lock without alternation would).
// (A turn with no GEMM, which the kernel takes for a block whose P V guarded_pv computes, merges
// its neighbours into one run: S_n+1 after P_n V_n, still one of each.)
// The producer (warpgroup 0) issues no wgmma; with one consumer warpgroup, warpgroup 2 none.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/emulator/sm90_emulator.h"
#include "cuda/fa3/kernels/elem.h"
#include "cuda/fa3/kernels/prefill_cta.h"

namespace kvattn::fa3 {

// The wgmma instructions of one block's O += P V (consumer_steps.h): k16 steps of P for 16-bit
// (issue_pv), k32 steps for FP8 in passes of at most 128 dims (pv_promoted).
template <class Tag, int QK, int VO>
constexpr int pv_wgmmas_per_block() {
  constexpr int EB = Elem<Tag>::kBytes;
  constexpr int kPSteps = SmemPlan<EB, QK, VO>::BN * EB / 32;
  return Elem<Tag>::kFp8 ? kPSteps * (VO / std::min(VO, 128)) : kPSteps;
}

struct PingPongCheck {
  int turns[3] = {};  // maximal runs per warpgroup (two consumers), else 0
  std::string error;  // empty when the order holds
};

inline PingPongCheck check_pingpong(const std::vector<emu::WgmmaEvent>& log, int consumers,
                                    int pv_wgmmas) {
  using E = emu::WgmmaEvent;
  PingPongCheck c;
  const auto at = [&](std::size_t i) {
    return "event " + std::to_string(i) + " of " + std::to_string(log.size()) + " (warpgroup " +
           std::to_string(log[i].warpgroup) + ")";
  };
  for (std::size_t i = 0; i < log.size(); ++i) {
    if (log[i].warpgroup == 0 || log[i].warpgroup > consumers) {
      c.error = at(i) + ": a wgmma of a warpgroup that is not a computing consumer";
      return c;
    }
  }
  if (consumers != 2) return c;
  for (std::size_t i = 0; i < log.size();) {
    const int wg = log[i].warpgroup;
    std::size_t end = i;
    while (end < log.size() && log[end].warpgroup == wg) ++end;
    ++c.turns[wg];
    int s_groups = 0, rs = 0;
    bool group_has_s = false;
    for (std::size_t j = i; j < end; ++j) {
      if (log[j].kind == E::kIssueSs) group_has_s = true;
      if (log[j].kind == E::kIssueRs) ++rs;
      if (log[j].kind == E::kCommit) {
        s_groups += group_has_s ? 1 : 0;
        group_has_s = false;
      }
    }
    if (log[end - 1].kind != E::kCommit) {
      c.error = at(end - 1) + ": warpgroup " + std::to_string(wg) +
                "'s turn ends with a wgmma group open: its GEMM interleaves with warpgroup " +
                std::to_string(3 - wg) + "'s (no ping-pong)";
      return c;
    }
    if (s_groups > 1 || rs > pv_wgmmas) {
      c.error = at(i) + ": warpgroup " + std::to_string(wg) + "'s turn holds " +
                std::to_string(s_groups) + " S = Q K^T and " + std::to_string(rs) +
                " P V wgmmas (at most 1 and " + std::to_string(pv_wgmmas) +
                "): more than one GEMM step while the other warpgroup waits";
      return c;
    }
    i = end;
  }
  return c;
}

}  // namespace kvattn::fa3
