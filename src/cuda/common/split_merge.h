// The split-KV merge of fa2 and fa3, host and device: one kernel body for both backends (run by
// split_merge.cu's kernel on the GPU and by the CPU replays), over a grid of one CTA per (merge
// row, query head) whose threads own kMergeVector consecutive output dims each, read as one
// float4 per partial state. Every thread folds the same chunk LSEs (a broadcast load), so a
// (row, head) needs no shared memory and no barrier, and the grid has rows x heads CTAs of
// D_vo / 4 threads: parallel over everything the serial one-CTA-per-row merge looped over.
//
// The partial states (written by the attention kernels) are [state, H_qo, D_vo] fp32 outputs,
// normalized per chunk with v_scale applied, and [state, H_qo] natural-log LSEs; a chunk with no
// visible key has lse = -inf and adds nothing (core/attention_math.h's StateMerger: a row whose
// chunks all saw nothing gets o = 0 and lse = -inf, or the sink); a NaN chunk is folded in and
// makes the row NaN (docs/cuda.md's numerics policy). The sink, when given, joins once, here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/attention_math.h"
#include "core/hd.h"
#include "core/numeric.h"
#include "cuda/common/merge_row.h"
#include "cuda/common/out_kind.h"
#include "cuda/common/store_element.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kvattn::cuda {

// Output dims per thread: one float4 of a partial row (D_vo is a multiple of 16 in fa2 and fa3,
// and every partial row starts 16-byte aligned: the states are dense fp32 from an aligned base).
inline constexpr int kMergeVector = 4;

// Everything the merge reads and writes; made by each backend from its kernel parameters
// (merge_params below), the same on the host and the device.
struct MergeParams {
  const MergeRow* rows = nullptr;
  int64_t num_rows = 0;
  const float* partial_o = nullptr;    // [state, num_heads, head_dim]
  const float* partial_lse = nullptr;  // [state, num_heads], natural log
  int num_heads = 1;
  int head_dim = 0;              // a multiple of kMergeVector
  const float* sinks = nullptr;  // [num_heads] (strided), natural-log logits; null: none
  int64_t sinks_stride = 1;
  void* out = nullptr;
  int64_t o_stride_row = 0, o_stride_head = 0, o_stride_dim = 1;
  OutKind out_kind = OutKind::kBF16;
  float* lse = nullptr;  // may be null
  int64_t lse_stride_row = 0, lse_stride_head = 1;
  float lse_scale = 1.0f;  // the final LSE's base
};

// The merge's parameters from a backend's kernel parameters (fa2's AttentionParams, fa3's
// PrefillParams: the same names for out, lse and the partial states).
template <class KernelParams>
MergeParams merge_params(const KernelParams& k, const MergeRow* rows, int64_t num_rows,
                         int num_heads, int head_dim, const float* sinks, int64_t sinks_stride) {
  MergeParams m;
  m.rows = rows;
  m.num_rows = num_rows;
  m.partial_o = k.partial_o;
  m.partial_lse = k.partial_lse;
  m.num_heads = num_heads;
  m.head_dim = head_dim;
  m.sinks = sinks;
  m.sinks_stride = sinks_stride;
  m.out = k.out;
  m.o_stride_row = k.o_stride_row;
  m.o_stride_head = k.o_stride_head;
  m.o_stride_dim = k.o_stride_dim;
  m.out_kind = k.out_kind;
  m.lse = k.lse;
  m.lse_stride_row = k.lse_stride_row;
  m.lse_stride_head = k.lse_stride_head;
  m.lse_scale = k.lse_scale;
  return m;
}

// The launch: grid (rows, heads), threads D_vo / kMergeVector rounded up to whole warps (the
// threads past D_vo idle). One function for the launchers and the replays.
struct MergeGrid {
  unsigned rows = 0;
  unsigned heads = 0;
  unsigned threads = 0;
};
inline MergeGrid merge_grid(const MergeParams& p) {
  const int lanes = (p.head_dim + kMergeVector - 1) / kMergeVector;
  return MergeGrid{unsigned(p.num_rows), unsigned(p.num_heads), unsigned((lanes + 31) / 32 * 32)};
}

// Where the merged values go: out (in its dtype) and lse. The replays' tests substitute a writer
// that records every store.
struct MergeOutWriter {
  KVATTN_HD void out(const MergeParams& p, int64_t out_row, int head, int d, float x) const {
    store_element(p.out, p.out_kind,
                  out_row * p.o_stride_row + head * p.o_stride_head + d * p.o_stride_dim, x);
  }
  KVATTN_HD void lse(const MergeParams& p, int64_t out_row, int head, float x) const {
    p.lse[out_row * p.lse_stride_row + head * p.lse_stride_head] = x;
  }
};

namespace merge_detail {
struct Vec4 {
  float x, y, z, w;
};
KVATTN_HD Vec4 load4(const float* src) {
#if defined(__CUDA_ARCH__)
  const float4 v = __ldg(reinterpret_cast<const float4*>(src));
  return Vec4{v.x, v.y, v.z, v.w};
#else
  Vec4 v;
  std::memcpy(&v, src, sizeof(v));
  return v;
#endif
}
KVATTN_HD float load1(const float* src) {
#if defined(__CUDA_ARCH__)
  return __ldg(src);
#else
  return *src;
#endif
}
}  // namespace merge_detail

// Thread `thread` of the CTA for (merge row `row_index`, query head `head`): output dims
// [thread * kMergeVector, + kMergeVector) of that row and head, and its LSE (thread 0).
template <class Writer = MergeOutWriter>
KVATTN_HD void merge_thread(const MergeParams& p, int64_t row_index, int head, int thread,
                            const Writer& writer = Writer{}) {
  const int d0 = thread * kMergeVector;
  if (d0 >= p.head_dim) return;
  const MergeRow row = p.rows[row_index];
  math::StateMerger merger;
  float o[kMergeVector] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (p.sinks) {  // a state with no value (the partials exclude the sink)
    float scale_acc = 0.0f, scale_c = 0.0f;
    merger.add(merge_detail::load1(p.sinks + head * p.sinks_stride), &scale_acc, &scale_c);
  }
  for (int64_t c = 0; c < row.chunks; ++c) {
    const int64_t state = (row.first_state + c) * p.num_heads + head;
    const float lse = merge_detail::load1(p.partial_lse + state);
    if (lse == -INFINITY) continue;  // a chunk with no visible key adds nothing
    float scale_acc = 0.0f, scale_c = 0.0f;
    merger.add(lse, &scale_acc, &scale_c);
    const merge_detail::Vec4 v = merge_detail::load4(p.partial_o + state * p.head_dim + d0);
    o[0] = o[0] * scale_acc + v.x * scale_c;
    o[1] = o[1] * scale_acc + v.y * scale_c;
    o[2] = o[2] * scale_acc + v.z * scale_c;
    o[3] = o[3] * scale_acc + v.w * scale_c;
  }
  const float inv_sum = merger.inv_sum();
  for (int i = 0; i < kMergeVector; ++i) writer.out(p, row.out_row, head, d0 + i, o[i] * inv_sum);
  if (p.lse && thread == 0) writer.lse(p, row.out_row, head, merger.lse() * p.lse_scale);
}

// The whole grid on the host, CTA by CTA and thread by thread (the CPU replays of fa2 and fa3).
template <class Writer = MergeOutWriter>
void merge_on_host(const MergeParams& p, const Writer& writer = Writer{}) {
  const MergeGrid g = merge_grid(p);
  for (unsigned x = 0; x < g.rows; ++x) {
    for (unsigned y = 0; y < g.heads; ++y) {
      for (unsigned t = 0; t < g.threads; ++t) merge_thread(p, int64_t(x), int(y), int(t), writer);
    }
  }
}

// The device kernel's address (split_merge.cu), for cudaLaunchKernel with a MergeParams argument
// and merge_grid's geometry; built with the CUDA objects only.
const void* split_merge_kernel();

}  // namespace kvattn::cuda
