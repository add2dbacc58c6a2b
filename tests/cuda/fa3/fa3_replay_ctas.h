// The kernel body of one fa3 key on emulated CTAs (fa3_replay_keys*.cc instantiate it per key).
#pragma once

#include "cuda/fa3/kernels/prefill_cta.h"
#include "cuda/fa3/params.h"
#include "cuda/fa3/fa3_emu_ops.h"
#include "cuda/emulator/sm90_emulator.h"

namespace kvattn::fa3 {

// `ctas` persistent CTAs, one after the other (CTAs share nothing but global memory, which the
// body reads, or writes disjointly: every output row and partial state once).
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
    cta.run([&](emu::Sm90Ops& ops, unsigned char* smem) {
      prefill_cta<Tag, QK, VO>(emu::Fa3EmuOps(ops, c, ctas), k, smem);
    });
  }
}

// Per element-type group (fa3_replay_keys16.cc, fa3_replay_keys8.cc): false for another key.
bool replay_kernel16(const KernelKey& key, const PrefillParams& k, int ctas, bool early);
bool replay_kernel8(const KernelKey& key, const PrefillParams& k, int ctas, bool early);

}  // namespace kvattn::fa3
