// fa3's attention kernel, prefill and decode (SM90a; q = kv bf16 or f16, or FP8 q over an FP8
// cache; head dims 64, 128, 256 and (192, 128)): FlashAttention-3's structure.
// A persistent CTA of three warpgroups walks the longest-first tile list (tile_scheduler.h).
// Warpgroup 0 is the producer: it loads each K/V block into a kStages-slot shared-memory ring
// (TMA for dense and ragged K/V, one thread issuing the loads and the expected bytes; cp.async
// with zero fill for pages) and signals the slot's `full` mbarrier, and its last warp copies each
// consumer warpgroup's Q rows of every tile behind the warpgroup's full_q / empty_q pair
// (producer.h's produce_q: the next tile's Q while the warpgroup's epilogue is done and the
// other computes); warpgroups 1 and 2 are
// consumers of 64 rows each: S = Q K^T by wgmma from shared memory, masking of the edge
// blocks only, online softmax in registers, O += P V by wgmma with P taken straight from S's
// accumulators as the register operand, then release of the slot through its `empty` mbarrier
// (pipeline_state.h), one block later, once the O += P V that read it is done. The epilogue
// writes O in the output's type through the warpgroup's Q tile with 16-byte stores (epilogue.h)
// and the natural-log LSE, or, for a request split over KV chunks, the tile's partial state for
// cuda/common/split_merge.h. A tile's rows are
// query tokens of one head (prefill) or the (token, head) rows of a GQA group packed together
// (decode; packed_rows.h). Index math lives in the replayed headers (smem_layout.h,
// wgmma_fragment.h, tile_scheduler.h, pipeline_state.h, packed_rows.h, ../split_plan.h).
// The body itself is prefill_cta.h (the consumers and the CTA; producer.h, kv_copies.h and
// cta_layout.h the rest), a host/device template over the thread's operations: here
// with DeviceOps (device_ops.cuh: the PTX), on the CPU with the SM90 CTA emulator
// (tests/cuda/fa3/fa3_replay_test.cc runs it against the fp64 reference).
//
// Keys past a request's end that a TMA box brings in (the next request's, or zeros past the
// tensor) are masked in S, so their V rows get weight exactly 0; an edge block whose V holds an
// inf or NaN takes consumer_steps.h's guarded_pv, so no masked key's V ever meets its zero weight
// (0 x inf; the numerics policy of docs/cuda.md).
//
// The softmax of one block runs while the GEMM O += P V of the previous one does (the consumer
// loop of prefill_cta.h), and the two consumer warpgroups take turns at the tensor cores, one's
// softmax under the other's GEMMs (named barriers: consumer_pingpong.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/fa3/kernels/device_ops.cuh"
#include "cuda/fa3/kernels/prefill_cta.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {

template <class Tag, int QK, int VO>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_kernel(const __grid_constant__ PrefillParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  prefill_cta<Tag, QK, VO>(DeviceOps{}, p, smem_raw);
#elif defined(__CUDA_ARCH__)
  // Never an empty kernel: a device pass for any other target (sm_80, sm_90 without the "a",
  // sm_100...) is a build error, not a kernel that returns without writing its output.
#error \
    "fa3's kernels use wgmma and setmaxnreg: compile them for sm_90a only (--generate-code=arch=compute_90a,code=sm_90a)"
#endif
}

// Launches `ctas` persistent CTAs (at most one per SM); returns the cudaError_t as an int.
template <class Tag, int HeadDimQK, int HeadDimVO>
int launch_prefill(const PrefillParams& p, int ctas, void* stream) {
  // fa3's declared head dims, for every type (FP8 rows padded to whole panels: SmemPlan).
  static_assert(
      (HeadDimQK == HeadDimVO && (HeadDimQK == 64 || HeadDimQK == 128 || HeadDimQK == 256)) ||
          (HeadDimQK == 192 && HeadDimVO == 128),
      "fa3's kernel: head dims 64, 128, 256 or (192, 128)");
  using Plan = SmemPlan<Elem<Tag>::kBytes, HeadDimQK, HeadDimVO>;
  const auto kernel = prefill_kernel<Tag, HeadDimQK, HeadDimVO>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Plan::total()));
  if (err != cudaSuccess) return int(err);
  kernel<<<ctas, kThreads, Plan::total(), static_cast<cudaStream_t>(stream)>>>(p);
  return int(cudaGetLastError());
}

}  // namespace kvattn::fa3
