// A pipeline shaped like fa3's on the SM90 emulator (sm90_emulator.h), with its faults put back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/fa3/kernels/pipeline_state.h"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/emulator/sm90_emulator.h"
#include "cuda/emulator/sm90_emulator_test_util.h"

namespace kvattn::fa3::emu {
namespace {
using namespace test;  // NOLINT(google-build-using-namespace): the tests' helpers

// ---- A pipeline shaped like fa3's (src/cuda/fa3/kernels/prefill.cuh): a producer warpgroup
// loading K blocks by TMA into a 2-slot ring (full / empty mbarriers, pipeline_state.h's
// parities, one arrival per consumer warp on empty), two consumer warpgroups computing
// S = Q K^T for their 64 rows by wgmma from fa3's swizzled tiles, the setmaxnreg split. The
// kernel's own mistakes, put in one at a time, fail naming the warp and the instruction.

enum class PipeFault { kNone, kReleaseBeforeWait, kQWithoutProxyFence, kProducerParity0 };

constexpr int kPipeD = 128, kPipeBN = 128, kPipeRowsPerWg = 64;
constexpr uint32_t kQTile = smem::tile_bytes(kPipeRowsPerWg, kPipeD);  // 16 KiB
constexpr uint32_t kKTile = smem::tile_bytes(kPipeBN, kPipeD);         // 32 KiB
constexpr uint32_t kPipeQ0 = 0, kPipeK0 = 2 * kQTile, kPipeBars = kPipeK0 + 2 * kKTile;

struct PipeResult {
  std::string error;
  std::vector<float> s;  // [block][row 0..127][key 0..127]
};

PipeResult run_pipeline(int keys, PipeFault fault, bool tma_early) {
  const int blocks = (keys + kPipeBN - 1) / kPipeBN;
  std::vector<uint16_t> k(std::size_t(keys) * kPipeD), q(std::size_t(2 * kPipeRowsPerWg) * kPipeD);
  for (int t = 0; t < keys; ++t)
    for (int d = 0; d < kPipeD; ++d) k[std::size_t(t * kPipeD + d)] = bf16(small_value(t, d, 11));
  for (int r = 0; r < 2 * kPipeRowsPerWg; ++r)
    for (int d = 0; d < kPipeD; ++d) q[std::size_t(r * kPipeD + d)] = bf16(small_value(r, d, 12));
  const uint64_t dims[3] = {kPipeD, 1, uint64_t(keys)};
  const uint64_t strides[2] = {kPipeD * 2, kPipeD * 2};
  const uint32_t box[3] = {64, 1, kPipeBN}, es[3] = {1, 1, 1};
  const TensorMap tma_k = encode_tensor_map_tiled(WgmmaType::kBf16, 3, k.data(), dims, strides, box,
                                                  es, Swizzle::k128B);
  PipeResult res;
  res.s.assign(std::size_t(blocks) * 128 * kPipeBN, std::nanf(""));
  Sm90Launch l = launch(384, kPipeBars + 64);
  l.tma_lands_early = tma_early;
  Sm90Cta cta(l);
  res.error = run_error(cta, [&](Sm90Ops& ops, unsigned char* smem) {
    auto* full = reinterpret_cast<uint64_t*>(smem + kPipeBars);
    uint64_t* empty = full + 2;
    if (ops.thread() == 0) {
      for (int s = 0; s < 2; ++s) {
        ops.mbarrier_init(&full[s], 1);
        ops.mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
      }
      ops.fence_barrier_init();
    }
    ops.sync_threads();
    const int wg = ops.warpgroup();
    if (wg == 0) {
      ops.setmaxnreg_dec<40>();
      if (ops.thread() != 0) return;
      pipe::PipelineState<2> st = pipe::producer_start<2>();
      if (fault == PipeFault::kProducerParity0) st.phase = 0;
      for (int n = 0; n < blocks; ++n) {
        ops.mbarrier_wait(&empty[st.index], st.phase);
        ops.mbarrier_arrive_expect_tx(&full[st.index], kKTile);
        for (int panel = 0; panel < 2; ++panel) {
          ops.tma_load_3d(
              smem + kPipeK0 + uint32_t(st.index) * kKTile + smem::tma_panel_offset(panel, kPipeBN),
              &tma_k, 64 * panel, 0, n * kPipeBN, &full[st.index]);
        }
        st.advance();
      }
      return;
    }
    ops.setmaxnreg_inc<232>();
    const int c = wg - 1, ctid = ops.thread() % 128;
    unsigned char* q_smem = smem + kPipeQ0 + uint32_t(c) * kQTile;
    // Q rows by 16-byte stores into the swizzled tile, then the proxy fence and the
    // warpgroup's barrier (prefill.cuh's order).
    for (int chunk = ctid; chunk < kPipeRowsPerWg * kPipeD / 8; chunk += 128) {
      const int row = chunk / (kPipeD / 8), col = chunk % (kPipeD / 8) * 8;
      struct alignas(16) U4 {
        uint16_t e[8];
      } v;
      std::memcpy(v.e, &q[std::size_t((c * kPipeRowsPerWg + row) * kPipeD + col)], 16);
      ops.st_shared(reinterpret_cast<U4*>(q_smem + smem::tile_offset(row, col, kPipeRowsPerWg)), v);
    }
    if (fault != PipeFault::kQWithoutProxyFence) ops.fence_proxy_async();
    ops.named_barrier_sync(1 + c, 128);
    pipe::PipelineState<2> st = pipe::consumer_start<2>();
    const uint32_t q_addr = ops.smem_addr(q_smem);
    for (int n = 0; n < blocks; ++n) {
      ops.mbarrier_wait(&full[st.index], st.phase);
      const uint32_t k_addr = ops.smem_addr(smem + kPipeK0 + uint32_t(st.index) * kKTile);
      Acc<64> s;
      ops.wgmma_fence();
      for (int ks = 0; ks < kPipeD * 2 / 32; ++ks) {
        ops.wgmma_ss(s, WgmmaType::kBf16, WgmmaType::kBf16,
                     smem::encode(smem::k_major(q_addr, kPipeRowsPerWg, 0, ks)), false,
                     smem::encode(smem::k_major(k_addr, kPipeBN, 0, ks)), false, ks > 0);
      }
      ops.wgmma_commit();
      const bool early = fault == PipeFault::kReleaseBeforeWait;
      if (early && ops.lane() == 0) ops.mbarrier_arrive(&empty[st.index]);
      ops.wgmma_wait<0>();
      for (int i = 0; i < 64; ++i) {
        const auto rc = frag::acc_element(ctid, i);
        res.s[(std::size_t(n) * 128 + std::size_t(c * 64 + rc.row)) * kPipeBN +
              std::size_t(rc.col)] = s[i];
      }
      if (!early && ops.lane() == 0) ops.mbarrier_arrive(&empty[st.index]);
      st.advance();
    }
  });
  return res;
}

TEST(Sm90Emulator, Fa3ShapedPipelineComputesEveryBlockAndCatchesItsFaults) {
  // 4 whole blocks and a partial fifth (the ring wraps twice; keys past the tensor are zeros).
  constexpr int kKeys = 4 * kPipeBN + 37;
  for (const bool early : {false, true}) {
    SCOPED_TRACE(early ? "TMA lands early" : "TMA lands late");
    const PipeResult ok = run_pipeline(kKeys, PipeFault::kNone, early);
    ASSERT_EQ(ok.error, "");
    for (int n = 0; n < 5; ++n)
      for (int r = 0; r < 128; ++r)
        for (int j = 0; j < kPipeBN; ++j) {
          const int key = n * kPipeBN + j;
          float want = 0;
          if (key < kKeys) {
            for (int d = 0; d < kPipeD; ++d)
              want += small_value(r, d, 12) * small_value(key, d, 11);
          }
          ASSERT_EQ(ok.s[(std::size_t(n) * 128 + std::size_t(r)) * kPipeBN + std::size_t(j)], want)
              << n << " " << r << " " << j;
        }
  }
  // The slot released before the wgmma that reads it retired: the producer's next load into it
  // lands while the wgmma is in flight.
  EXPECT_FAILS_WITH(run_pipeline(kKeys, PipeFault::kReleaseBeforeWait, true).error,
                    "a TMA load issued by warp 0", "operand of a wgmma.mma_async",
                    "still in flight");
  EXPECT_FAILS_WITH(run_pipeline(kKeys, PipeFault::kQWithoutProxyFence, false).error,
                    "async-proxy read", "operand A", "fence.proxy.async");
  // The producer's first wait on `empty` with parity 0 (pipeline_state.h starts it at 1): it
  // waits for a release nobody makes before its first load.
  EXPECT_FAILS_WITH(run_pipeline(kKeys, PipeFault::kProducerParity0, false).error, "deadlock",
                    "mbarrier.try_wait.parity 0", "warp 0 (1 threads)");
}

}  // namespace
}  // namespace kvattn::fa3::emu
