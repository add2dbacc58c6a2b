// The kernel body of one fa3 key on emulated CTAs (fa3_replay_keys*.cc instantiate it per key).
#pragma once

#include <string>

#include "cuda/fa3/kernels/prefill_cta.h"
#include "cuda/fa3/params.h"
#include "cuda/fa3/fa3_emu_ops.h"
#include "cuda/fa3/fa3_pingpong.h"
#include "cuda/emulator/sm90_emulator.h"

namespace kvattn::fa3 {

// The tile of SmemPlan `Plan` at byte `offset` of the CTA's tiles.
template <class Plan>
emu::SmemTile smem_tile_of(uint32_t offset) {
  if (offset < Plan::k(0)) return emu::SmemTile::kQ;
  for (int s = 0; s < kStages; ++s) {
    if (offset >= Plan::k(s) && offset < Plan::k(s) + Plan::kKBytes) return emu::SmemTile::kK;
    if (offset >= Plan::v(s) && offset < Plan::v(s) + Plan::kVBytes) return emu::SmemTile::kV;
    if (offset >= Plan::v_stage(s) && offset < Plan::v_stage(s) + Plan::kVStageBytes) {
      return emu::SmemTile::kVStage;
    }
  }
  return emu::SmemTile::kOther;
}

// `ctas` persistent CTAs, one after the other (CTAs share nothing but global memory, which the
// body reads, or writes disjointly: every output row and partial state once), each counting its
// shared-memory stores' wavefronts (fa3_emu_ops.h's SmemStoreCounting), each checked for the
// consumer ping-pong (fa3_pingpong.h) on its wgmma order, which fails the replay.
template <class Tag, int QK, int VO>
void replay_ctas(const PrefillParams& k, int ctas, bool early) {
  using Plan = SmemPlan<Elem<Tag>::kBytes, QK, VO>;
  for (int c = 0; c < ctas; ++c) {
    emu::Sm90Launch l;
    l.threads = kThreads;
    l.smem_bytes = Plan::total();
    l.regs_per_thread = kLaunchRegs;
    l.tma_lands_early = early;
    emu::Sm90Cta cta(l);
    emu::SmemStoreCounting stores{emu::WarpAccessCounter(kThreads, int(emu::SmemTile::kCount)),
                                  emu::WarpAccessCounter(kThreads, int(emu::SmemTile::kCount)),
                                  smem_tile_of<Plan>};
    cta.run([&](emu::Sm90Ops& ops, unsigned char* smem) {
      const uint32_t raw = ops.smem_addr(smem);
      stores.base = raw + ((1024u - (raw & 1023u)) & 1023u);  // as prefill_cta rounds it
      prefill_cta<Tag, QK, VO>(emu::Fa3EmuOps(ops, c, ctas, &stores), k, smem);
    });
    stores.publish();
    const PingPongCheck pp =
        check_pingpong(cta.wgmma_log(), k.consumer_warpgroups, pv_wgmmas_per_block<Tag, QK, VO>());
    if (!pp.error.empty()) {
      throw emu::EmulatorError("CTA " + std::to_string(c) + ", consumer ping-pong: " + pp.error);
    }
    for (int wg = 1; wg < 3; ++wg) emu::replay_counters().pingpong_turns[wg] += pp.turns[wg];
  }
}

// Per element-type group (fa3_replay_keys16.cc, fa3_replay_keys8.cc): false for another key.
bool replay_kernel16(const KernelKey& key, const PrefillParams& k, int ctas, bool early);
bool replay_kernel8(const KernelKey& key, const PrefillParams& k, int ctas, bool early);

}  // namespace kvattn::fa3
