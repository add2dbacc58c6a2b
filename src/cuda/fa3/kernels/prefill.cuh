// fa3's attention kernel, prefill and decode (SM90a; q = kv bf16 or f16, or FP8 q over an FP8
// cache; head dims 64, 128, 256 and (192, 128)): FlashAttention-3's structure.
// A persistent CTA of three warpgroups walks the longest-first tile list (tile_scheduler.h).
// Warpgroup 0 is the producer: it loads each K/V block into a kStages-slot shared-memory ring
// (TMA for dense and ragged K/V, one thread issuing the loads and the expected bytes; cp.async
// with zero fill for pages) and signals the slot's `full` mbarrier; warpgroups 1 and 2 are
// consumers of 64 rows each: S = Q K^T by wgmma from shared memory, masking of the edge
// blocks only, online softmax in registers, O += P V by wgmma with P taken straight from S's
// accumulators as the register operand, then release of the slot through its `empty` mbarrier
// (pipeline_state.h), one block later, once the O += P V that read it is done. The epilogue
// writes O (and the natural-log LSE) from the accumulators, or, for a request split over KV
// chunks, the tile's partial state for merge.cuh. A tile's rows are
// query tokens of one head (prefill) or the (token, head) rows of a GQA group packed together
// (decode; packed_rows.h). Index math lives in the replayed headers (smem_layout.h,
// wgmma_fragment.h, tile_scheduler.h, pipeline_state.h, packed_rows.h, ../split_plan.h).
//
// Keys past a request's end that a TMA box brings in (the next request's, or zeros past the
// tensor) are masked in S, so their V rows are multiplied by exactly 0.
//
// The softmax of one block runs while the GEMM O += P V of the previous one does (the consumer
// loop below). Not here yet (see docs/cuda.md): the two consumer warpgroups' ping-pong (their
// softmax against each other's GEMMs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/common/row_finish.h"
#include "cuda/common/store_out.cuh"
#include "cuda/fa3/kernels/consumer_steps.cuh"
#include "cuda/fa3/kernels/packed_rows.h"
#include "cuda/fa3/kernels/pipeline_state.h"
#include "cuda/fa3/kernels/sm90_ptx.cuh"
#include "cuda/fa3/kernels/sm90_wgmma_fp8.cuh"
#include "cuda/fa3/kernels/smem_layout.h"
#include "cuda/fa3/kernels/tile_scheduler.h"
#include "cuda/fa3/kernels/wgmma_fragment.h"
#include "cuda/fa3/params.h"

namespace kvattn::fa3 {

inline constexpr int kStages = 2;
inline constexpr int kThreads = 3 * frag::kWarpgroupThreads;
inline constexpr int kConsumerWarps = 8;
// Register split between the producer and the consumers (setmaxnreg): 128 x 40 + 256 x 232 fits
// the 64 K registers of an SM with one CTA resident. (The producer's copy loops are unrolled by
// 2, by 1 for FP8's V, which its producer transposes through registers, and for K rows of 12
// chunks (FP8 at 192): more spills at 40 otherwise.)
inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;

// What differs between the 16-bit and the FP8 kernel: element size, and with it the k-step of
// wgmma (k16 / k32), the tile layout (64 / 128 columns per panel) and how V is stored (as is,
// read MN-major / transposed with renumbered keys, read K-major: FP8 wgmma has no transpose).
template <class Tag>
struct Elem {
  static constexpr int kBytes = 2;
  static constexpr bool kFp8 = false;
};
template <>
struct Elem<E4m3Tag> {
  static constexpr int kBytes = 1;
  static constexpr bool kFp8 = true;
};
template <>
struct Elem<E5m2Tag> {
  static constexpr int kBytes = 1;
  static constexpr bool kFp8 = true;
};
template <>
struct Elem<E4m3E5m2Tag> : Elem<E4m3Tag> {};
template <>
struct Elem<E5m2E4m3Tag> : Elem<E4m3Tag> {};

// Rows are whole 128-byte panels (smem::padded_row_bytes): FP8 Q/K rows at head dims 64 and 192,
// and FP8 V^T rows of 64 keys (head dim 256), carry padding.
template <int EB, int QK, int VO>
struct SmemPlan {
  static constexpr int BN = sched::block_n_for(QK);
  static constexpr uint32_t kQBytes =  // per warpgroup
      frag::kWarpgroupRows * smem::padded_row_bytes(QK * EB);
  static constexpr uint32_t kKBytes = BN * smem::padded_row_bytes(QK * EB);
  // 16-bit V [keys][dims]; FP8 V^T [dims][keys].
  static constexpr uint32_t kVBytes =
      EB == 2 ? BN * smem::padded_row_bytes(VO * EB) : VO * smem::padded_row_bytes(BN);
  static constexpr uint32_t q(int wg) { return uint32_t(wg) * kQBytes; }
  static constexpr uint32_t k(int stage) {
    return 2 * kQBytes + uint32_t(stage) * (kKBytes + kVBytes);
  }
  static constexpr uint32_t v(int stage) { return k(stage) + kKBytes; }
  static constexpr uint32_t barriers() { return k(kStages); }
  // + 1024: the dynamic shared memory base is rounded up to the swizzle's alignment.
  static constexpr uint32_t total() { return barriers() + 2 * kStages * 8 + 1024; }
};

template <int EB>
__device__ __forceinline__ const uint8_t* kv_row(const PrefillParams& p, const RequestInfo& r,
                                                 const void* base, const paged::CacheStrides& s,
                                                 int64_t key, int kv_head) {
  int64_t off;
  if (p.paged) {
    const int32_t page = p.kv_indices[r.kv_first + key / p.page_size];
    off = s.offset(page, key % p.page_size, kv_head, 0);
  } else {
    off = s.offset(0, r.kv_first + key, kv_head, 0);
  }
  return static_cast<const uint8_t*>(base) + off * EB;
}

// The K/V blocks of `tile` (its chunk's, when its request is split): one function for the
// producer and the consumers, the same the planner ordered the tiles by.
template <int BN>
__device__ __forceinline__ sched::KvRange tile_range(const PrefillParams& p,
                                                     const sched::Tile& tile,
                                                     const RequestInfo& r) {
  return sched::tile_kv_range(tile, r.qo_len, r.kv_len, p.causal, p.window_left, BN,
                              p.rows_per_token, r.chunks, p.chunk_blocks);
}

// Warpgroup 0: K/V blocks of every tile of this CTA into the ring, in the consumers' order.
template <class Tag, int QK, int VO>
__device__ __forceinline__ void produce(const PrefillParams& p, uint8_t* smem, uint64_t* full,
                                        uint64_t* empty) {
  constexpr int EB = Elem<Tag>::kBytes;
  using Plan = SmemPlan<EB, QK, VO>;
  constexpr int BN = Plan::BN;
  const int tid = threadIdx.x;  // 0..127
  pipe::PipelineState<kStages> st = pipe::producer_start<kStages>();
  if (!Elem<Tag>::kFp8 && p.tma) {
    // One thread issues every load: the expected bytes, then the panels of K and of V.
    if (tid != 0) return;
    for (int t = sched::first_tile(blockIdx.x); t < p.num_tiles;
         t = sched::next_tile(t, gridDim.x)) {
      const sched::Tile tile = p.tiles[t];
      const RequestInfo r = p.requests[tile.request];
      const sched::KvRange kr = tile_range<BN>(p, tile, r);
      const int kv_head = pack::kv_head(tile.head, p.rows_per_token, p.group);
      for (int n = kr.begin; n < kr.end; ++n) {
        ptx::mbarrier_wait(&empty[st.index], st.phase);
        ptx::mbarrier_arrive_expect_tx(&full[st.index], Plan::kKBytes + Plan::kVBytes);
        // < the map's tokens <= 2^31 - 1 (launch.cu: tma_token_coordinates_fit, else cp.async)
        const int token = int(r.kv_first + int64_t(n) * BN);
#pragma unroll
        for (int panel = 0; panel < QK / smem::kPanelCols16; ++panel) {
          ptx::tma_load_3d(smem + Plan::k(st.index) + smem::tma_panel_offset(panel, BN), &p.tma_k,
                           panel * smem::kPanelCols16, kv_head, token, &full[st.index]);
        }
#pragma unroll
        for (int panel = 0; panel < VO / smem::kPanelCols16; ++panel) {
          ptx::tma_load_3d(smem + Plan::v(st.index) + smem::tma_panel_offset(panel, BN), &p.tma_v,
                           panel * smem::kPanelCols16, kv_head, token, &full[st.index]);
        }
        st.advance();
      }
    }
    return;
  }
  constexpr int kKRowChunks = QK * EB / 16;  // 16-byte chunks per K row
  constexpr int kVRowChunks = VO * EB / 16;
  for (int t = sched::first_tile(blockIdx.x); t < p.num_tiles; t = sched::next_tile(t, gridDim.x)) {
    const sched::Tile tile = p.tiles[t];
    const RequestInfo r = p.requests[tile.request];
    const sched::KvRange kr = tile_range<BN>(p, tile, r);
    const int kv_head = pack::kv_head(tile.head, p.rows_per_token, p.group);
    for (int n = kr.begin; n < kr.end; ++n) {
      ptx::mbarrier_wait(&empty[st.index], st.phase);
      uint8_t* k_smem = smem + Plan::k(st.index);
      uint8_t* v_smem = smem + Plan::v(st.index);
#pragma unroll(kKRowChunks % 8 == 0 ? 2 : 1)
      for (int c = tid; c < BN * kKRowChunks; c += frag::kWarpgroupThreads) {
        const int row = c / kKRowChunks, byte_col = (c % kKRowChunks) * 16;
        const int64_t key = int64_t(n) * BN + row;
        const bool in = key < r.kv_len;
        const int64_t src_key = in ? key : 0;  // a valid address; zero bytes are read
        const uint8_t* src = kv_row<EB>(p, r, p.k, p.k_strides, src_key, kv_head) + byte_col;
        const uint32_t dst = Elem<Tag>::kFp8 ? smem::tile_offset8(row, byte_col, BN)
                                             : smem::tile_offset(row, byte_col / 2, BN);
        cuda::cp_async_16_zfill(k_smem + dst, src, in);
      }
#pragma unroll(Elem <Tag>::kFp8 ? 1 : 2)
      for (int c = tid; c < BN * kVRowChunks; c += frag::kWarpgroupThreads) {
        const int row = c / kVRowChunks, byte_col = (c % kVRowChunks) * 16;
        const int64_t key = int64_t(n) * BN + row;
        const bool in = key < r.kv_len;
        const int64_t src_key = in ? key : 0;
        const uint8_t* src = kv_row<EB>(p, r, p.v, p.v_strides, src_key, kv_head) + byte_col;
        if constexpr (!Elem<Tag>::kFp8) {
          cuda::cp_async_16_zfill(v_smem + smem::tile_offset(row, byte_col / 2, BN), src, in);
        } else {
          // V^T [dim][key], its columns renumbered as P's A fragment needs (wgmma_fragment.h).
          uint4 vals = make_uint4(0, 0, 0, 0);
          if (in) vals = *reinterpret_cast<const uint4*>(src);
          const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&vals);
          const int col = (row / 32) * 32 + frag::fp8_column_of_key(row % 32);
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            v_smem[smem::tile_offset8(byte_col + e, col, VO)] = bytes[e];
          }
        }
      }
      cuda::cp_async_wait_all();
      ptx::fence_proxy_async();
      ptx::mbarrier_arrive(&full[st.index]);
      st.advance();
    }
  }
}

template <class Tag, int QK, int VO>
__device__ __forceinline__ void consume(const PrefillParams& p, uint8_t* smem, uint64_t* full,
                                        uint64_t* empty, int wg) {
  constexpr int EB = Elem<Tag>::kBytes;
  constexpr bool kFp8 = Elem<Tag>::kFp8;
  using Plan = SmemPlan<EB, QK, VO>;
  constexpr int BN = Plan::BN;
  constexpr int kSRegs = BN / 2;  // S accumulators per thread (N = keys of a block)
  constexpr int kORegs = VO / 2;  // O accumulators per thread (N = the V head dim)
  const int ctid = threadIdx.x % frag::kWarpgroupThreads;
  const int lane = threadIdx.x % 32;
  uint8_t* q_smem = smem + Plan::q(wg);
  const uint32_t q_addr = cuda::smem_addr(q_smem);
  pipe::PipelineState<kStages> st = pipe::consumer_start<kStages>();

  for (int t = sched::first_tile(blockIdx.x); t < p.num_tiles; t = sched::next_tile(t, gridDim.x)) {
    const sched::Tile tile = p.tiles[t];
    const RequestInfo r = p.requests[tile.request];
    const sched::KvRange kr = tile_range<BN>(p, tile, r);
    // Rows are packed rows (packed_rows.h): query tokens, or (token, head) of a GQA group.
    // (32 bits: a request's packed rows are at most pack::kMaxPackedRows.)
    const int row0 = tile.q_tile * sched::kBlockM + wg * frag::kWarpgroupRows;
    // The causal diagonal of this thread's two rows (one per accumulator row half) is
    // diag0 + token_step[h]: the token of the warpgroup's first row plus the (32-bit) token
    // offset of the row, both found once per tile (a division per masked block spills).
    const int64_t token0 = pack::token_of(row0, p.rows_per_token);
    const int64_t diag0 = token0 + r.kv_len - r.qo_len;
    int token_step[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      token_step[h] =
          int(pack::token_of(row0 + frag::acc_element(ctid, 2 * h).row, p.rows_per_token) - token0);
    }

    // Q rows of this warpgroup into its swizzled tile (zeros past qo_len), once every warp of
    // the warpgroup is past the previous tile's wgmmas, which read it.
    ptx::named_barrier_sync(1 + wg, frag::kWarpgroupThreads);
    constexpr int kRowChunks = QK * EB / 16;
    for (int c = ctid; c < frag::kWarpgroupRows * kRowChunks; c += frag::kWarpgroupThreads) {
      const int tile_row = c / kRowChunks, byte_col = (c % kRowChunks) * 16;
      const int64_t row = row0 + tile_row;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (row < pack::packed_rows(r.qo_len, p.rows_per_token)) {
        const pack::TokenHead th = pack::token_head(row, tile.head, p.rows_per_token);
        val = *reinterpret_cast<const uint4*>(
            static_cast<const uint8_t*>(p.q) +
            ((r.q_row + th.token) * p.q_stride_row + th.qo_head * p.q_stride_head) * EB + byte_col);
      }
      const uint32_t dst = kFp8 ? smem::tile_offset8(tile_row, byte_col, frag::kWarpgroupRows)
                                : smem::tile_offset(tile_row, byte_col / 2, frag::kWarpgroupRows);
      *reinterpret_cast<uint4*>(q_smem + dst) = val;
    }
    ptx::fence_proxy_async();
    ptx::named_barrier_sync(1 + wg, frag::kWarpgroupThreads);

    float o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};

    // Softmax of block n overlapped with O += P V of block n - 1 (FA3's intra-warpgroup
    // overlap): S_n is issued before PV_{n-1}, waited for alone (wgmma groups complete in order),
    // and turned into P_n while PV_{n-1} runs; O is rescaled once PV_{n-1} is done, and slot n - 1
    // is released then (pipeline_state.h: a consumer holds at most two slots, released in
    // order; fa3_pipeline_test replays it).
    // FP8 keeps the blocks apart (one at a time, as below the overlap): with S, P and O live at
    // once its consumers spill (ptxas: 64 bytes), and FP8's P is half the registers that would
    // pay for it.
    constexpr int kPSteps = BN * EB / 32;
    constexpr bool kOverlap = !kFp8;
    float s[kSRegs];
    uint32_t a[kPSteps][4];
    if constexpr (!kOverlap) {
      for (int n = kr.begin; n < kr.end; ++n) {
        ptx::mbarrier_wait(&full[st.index], st.phase);
        step::issue_s<Tag, QK, EB, BN>(s, q_addr, cuda::smem_addr(smem + Plan::k(st.index)));
        ptx::wgmma_wait<0>();
        ptx::fence_registers(s);
        step::scores<BN>(s, p, kr.masked(n), n, r.kv_len, diag0, token_step, ctid);
        float alpha[2];
        step::softmax<BN>(s, m, l, alpha);
        step::rescale(o, alpha);
        step::pack_p<Tag, kFp8, BN, kPSteps>(s, a);
        step::issue_pv<Tag, kFp8, VO, BN, kPSteps>(o, a, cuda::smem_addr(smem + Plan::v(st.index)));
        ptx::wgmma_wait<0>();
        step::pv_done<VO, kPSteps>(o, a);
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(&empty[st.index]);
        st.advance();
      }
    } else if (kr.begin < kr.end) {
      ptx::mbarrier_wait(&full[st.index], st.phase);
      step::issue_s<Tag, QK, EB, BN>(s, q_addr, cuda::smem_addr(smem + Plan::k(st.index)));
      ptx::wgmma_wait<0>();
      ptx::fence_registers(s);
      step::scores<BN>(s, p, kr.masked(kr.begin), kr.begin, r.kv_len, diag0, token_step, ctid);
      float alpha[2];
      step::softmax<BN>(s, m, l, alpha);  // O is still zero: nothing to rescale
      step::pack_p<Tag, kFp8, BN, kPSteps>(s, a);
      pipe::PipelineState<kStages> prev = st;
      st.advance();
      for (int n = kr.begin + 1; n < kr.end; ++n) {
        ptx::mbarrier_wait(&full[st.index], st.phase);
        step::issue_s<Tag, QK, EB, BN>(s, q_addr, cuda::smem_addr(smem + Plan::k(st.index)));
        step::issue_pv<Tag, kFp8, VO, BN, kPSteps>(o, a,
                                                   cuda::smem_addr(smem + Plan::v(prev.index)));
        ptx::wgmma_wait<1>();  // S_n done; PV_{n-1} may still run
        ptx::fence_registers(s);
        step::scores<BN>(s, p, kr.masked(n), n, r.kv_len, diag0, token_step, ctid);
        step::softmax<BN>(s, m, l, alpha);
        ptx::wgmma_wait<0>();  // PV_{n-1} done: its slot, O and P are free
        step::pv_done<VO, kPSteps>(o, a);
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(&empty[prev.index]);
        step::rescale(o, alpha);
        step::pack_p<Tag, kFp8, BN, kPSteps>(s, a);
        prev = st;
        st.advance();
      }
      step::issue_pv<Tag, kFp8, VO, BN, kPSteps>(o, a, cuda::smem_addr(smem + Plan::v(prev.index)));
      ptx::wgmma_wait<0>();
      step::pv_done<VO, kPSteps>(o, a);
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(&empty[prev.index]);
    }

    // Epilogue: normalize, write O and the natural-log LSE of the rows this request has.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    // Where each of this thread's two rows goes: out (and lse), or, for a split request, the
    // partial state of (token, chunk) (split_plan.h), merged by merge_kernel. The request is read
    // again here (the mbarrier waits' memory clobbers keep it a load) so that its split fields
    // hold no registers during the main loop.
    const RequestInfo re = p.requests[tile.request];
    const bool split = re.chunks > 1;
    const int64_t rows = pack::packed_rows(re.qo_len, p.rows_per_token);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + frag::acc_element(ctid, 2 * h).row;
      if (row >= rows) continue;
      const pack::TokenHead th = pack::token_head(row, tile.head, p.rows_per_token);
      const int64_t state = re.partial_base + th.token * re.chunks + tile.chunk;
      // The row's end (cuda/common/row_finish.h, fa2's too): o = 0 and lse = -inf without a
      // visible key, o = lse = NaN after a NaN score (the numerics policy; a split merge then
      // folds the NaN in instead of dropping the row). FP8's O carries P's 2^8 (pack_p).
      const cuda::RowFinish fin = cuda::finish_row(m[h], l[h], p.v_scale);
      const float inv = kFp8 ? fin.o_scale * step::kFp8PUnscale : fin.o_scale;
      if (split) {
        float* dst = p.partial_o + (state * p.num_qo_heads + th.qo_head) * VO;
#pragma unroll
        for (int i = 0; i < kORegs; ++i) {
          if (frag::acc_row_half(i) == h) dst[frag::acc_element(ctid, i).col] = o[i] * inv;
        }
      } else {
        const int64_t base = (re.q_row + th.token) * p.o_stride_row + th.qo_head * p.o_stride_head;
#pragma unroll
        for (int i = 0; i < kORegs; ++i) {
          if (frag::acc_row_half(i) == h)
            cuda::store_out(p, base + frag::acc_element(ctid, i).col, o[i] * inv);
        }
      }
      if (lane % 4 != 0) continue;
      const float lse = fin.lse;
      if (split) {
        p.partial_lse[state * p.num_qo_heads + th.qo_head] = lse;
      } else if (p.lse) {
        p.lse[(re.q_row + th.token) * p.lse_stride_row + th.qo_head * p.lse_stride_head] = lse;
      }
    }
  }
}

template <class Tag, int QK, int VO>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_kernel(const __grid_constant__ PrefillParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (cuda::smem_addr(smem_raw) & 1023u)) & 1023u);
  using Plan = SmemPlan<Elem<Tag>::kBytes, QK, VO>;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Plan::barriers());
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // TMA: one arrival with the expected bytes; cp.async: every producer thread arrives.
      ptx::mbarrier_init(&full[s], !Elem<Tag>::kFp8 && p.tma ? 1 : frag::kWarpgroupThreads);
      ptx::mbarrier_init(&empty[s], kConsumerWarps);  // one arrival per consumer warp
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  const int wg = threadIdx.x / frag::kWarpgroupThreads;
  if (wg == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    produce<Tag, QK, VO>(p, smem, full, empty);
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    consume<Tag, QK, VO>(p, smem, full, empty, wg - 1);
  }
#elif defined(__CUDA_ARCH__)
  // Never an empty kernel: a device pass for any other target (sm_80, sm_90 without the "a",
  // sm_100...) is a build error, not a kernel that returns without writing its output.
#error "fa3's kernels use wgmma and setmaxnreg: compile them for sm_90a only (--generate-code=arch=compute_90a,code=sm_90a)"
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
