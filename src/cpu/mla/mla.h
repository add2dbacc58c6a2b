// The CPU MLA path (batch_mla_paged): plain-data parameters shared by the planner (mla.cc,
// portable) and the per-ISA item kernels (mla_avx512_bf16.cc).
//
// A work item is one request's block of query tokens against a range of its keys. Its rows are
// (query token, head): every head of the block shares each latent tile (ckv + kpe rows of
// kMlaTileKeys keys), which is read once and multiplied against all the rows, i.e. one small GEMM
// per tile for the scores and one for the output.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/paged_kv.h"
#include "cpu/common/workspace.h"
#include "kvattn/attention.h"
#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn::cpu {

// Keys per latent tile: 128 keys of ckv + kpe (bf16: 144 KiB) stay in L2 while every row of the
// item passes over them (so many so that the AMX kernel loads and stores each output
// accumulator tile once per 128 keys); also the granularity of the split-KV chunks.
inline constexpr int kMlaTileKeys = 128;
// Rows (query token x head) of one item at most: 128 heads of one token (DeepSeek-V3), or as many
// tokens of fewer heads. Bounds the per-thread accumulators at 128 x D_ckv f32.
inline constexpr int kMlaMaxRows = 128;
inline int mla_tokens_per_item(int num_heads) {
  return num_heads >= kMlaMaxRows ? 1 : kMlaMaxRows / num_heads;
}

struct MlaParams {
  int heads = 0, d_ckv = 0, d_kpe = 0;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16;
  // Element strides; row r of the ragged query is qo_indptr[b] + i.
  const std::byte* q_nope = nullptr;
  int64_t qn_row = 0, qn_head = 0, qn_dim = 1;
  const std::byte* q_pe = nullptr;
  int64_t qp_row = 0, qp_head = 0, qp_dim = 1;
  // The caches [P, page_size, D] (core/paged_kv.h's strides by meaning; head unused).
  const std::byte* ckv = nullptr;
  paged::CacheStrides ckv_strides;
  const std::byte* kpe = nullptr;
  paged::CacheStrides kpe_strides;
  const int32_t* kv_indptr = nullptr;
  const int32_t* kv_indices = nullptr;
  int64_t indptr_stride = 1, indices_stride = 1;
  int64_t page_size = 1;
  const int64_t* qo_begin = nullptr;  // first query row of each request
  const int64_t* qo_len = nullptr;
  const int64_t* kv_len = nullptr;
  bool causal = false;
  float score_scale_log2 = 1;  // sm_scale * k_scale * log2(e): scores in base 2
  float k_scale = 1;           // the values (ckv) are dequantized once, on the output

  int64_t kv_elem_bytes = 2;

  // Key j of request b lives in page kv_indices[kv_indptr[b] + j / page_size], slot j % page_size.
  const std::byte* ckv_row(int b, int64_t j) const {
    return ckv + ckv_strides.offset(page_of(b, j), j % page_size, 0, 0) * kv_elem_bytes;
  }
  const std::byte* kpe_row(int b, int64_t j) const {
    return kpe + kpe_strides.offset(page_of(b, j), j % page_size, 0, 0) * kv_elem_bytes;
  }
  // The vector kernels read q, ckv and kpe rows at unit stride.
  bool unit_stride_rows() const {
    return qn_dim == 1 && qp_dim == 1 && ckv_strides.dim == 1 && kpe_strides.dim == 1;
  }
  int64_t page_of(int b, int64_t j) const {
    return kv_indices[(int64_t{kv_indptr[b * indptr_stride]} + j / page_size) * indices_stride];
  }
  // How many of the n keys from j0 query token i of request b sees (causal: bottom-right
  // aligned).
  int visible_keys(int b, int64_t i, int64_t j0, int n) const {
    int64_t end = kv_len[b];
    if (causal) end = std::clamp<int64_t>(i + kv_len[b] - qo_len[b] + 1, 0, kv_len[b]);
    return static_cast<int>(std::clamp<int64_t>(end - j0, 0, n));
  }
};

// The per-thread scratch of the kernels, laid out by the one function that also sizes it for the
// planner (base null: sizes only; mla_kernel_scratch_bytes). Q and Tile are the element types of
// the packed query and of the tile copy: f32 in the AVX2 and portable kernels, bf16 pairs and
// bf16 in the AVX512_BF16 one (the slots are sized for 4-byte elements). The AMX kernel lays out
// its own inside the same size.
template <class Q, class Tile>
struct MlaScratch {
  Q* q;                  // [tokens][D_qk (/ 2 pairs)][heads]: the query, heads in lanes
  float* st;             // [T][heads]: scores, then probabilities
  uint32_t* pp;          // [T / 2][heads]: probability pairs (bf16)
  Tile* tile;            // [T][D_ckv + D_kpe]: a copy of the tile, then a zero row
  uint32_t* vp;          // [T / 2][D_ckv]: value pairs, per 32-dim block (lo, hi) zmm
  float* acc;            // [rows][D_ckv]: output accumulators
  float *m, *l, *alpha;  // [rows]: running max and sum, rescale
  std::size_t size;      // bytes
  MlaScratch(std::byte* base, int d_ckv, int d_kpe) {
    const std::size_t rows = kMlaMaxRows, keys = kMlaTileKeys;
    const std::size_t dqk = static_cast<std::size_t>(d_ckv + d_kpe), dv = d_ckv;
    RegionCursor s(base);
    q = s.take<Q>(rows * dqk * 4);
    st = s.take<float>(rows * keys * 4);
    pp = s.take<uint32_t>(rows * keys * 4);
    tile = s.take<Tile>(keys * dqk * 4 + dqk * 4);
    vp = s.take<uint32_t>(keys * dv * 4);
    acc = s.take<float>(rows * dv * 4);
    m = s.take<float>(rows * 4);
    l = s.take<float>(rows * 4);
    alpha = s.take<float>(rows * 4);
    size = s.size();
  }
};

// One item: rows r = (token t - w.qo_begin) * heads + h, writing o [rows, d_ckv] (normalized,
// dequantized) and lse [rows] (natural log; -inf and o = 0 for a row that sees no key of the
// item). `scratch` holds mla_kernel_scratch_bytes.
using MlaItemFn = void (*)(const MlaParams& p, const WorkItem& w, float* o, float* lse,
                           std::byte* scratch);

// Per-thread scratch of the kernels; one function for planner and kernels.
std::size_t mla_kernel_scratch_bytes(int heads, int d_ckv, int d_kpe);

// The bf16 dot-product kernel (AVX512_BF16), or nullptr where it does not apply: a bf16 query
// over a bf16/e4m3/e5m2 cache with unit-stride rows, D_ckv % 64 == 0, D_kpe % 16 == 0, heads %
// 16 == 0, on a CPU that has the instructions.
MlaItemFn find_mla_kernel_avx512_bf16(const MlaParams& p);
// The AMX-BF16 tile kernel, or nullptr where it does not apply: as the AVX512_BF16 one, with
// D_kpe % 32 == 0, on a CPU with AMX whose OS grants the tile state. Preferred where it applies.
MlaItemFn find_mla_kernel_amx(const MlaParams& p);
// The same kernel body on emulated tiles (common/amx.h; the CPU needs AVX512_BF16 and VBMI): for
// tests on CPUs without AMX. Built with KVATTN_CPU_AMX_EMULATION.
MlaItemFn find_mla_kernel_amx_emulated(const MlaParams& p);
// The AVX2 + FMA kernel (f32 arithmetic), or nullptr where it does not apply: a bf16/f16/f32
// query over a bf16/f16/e4m3/e5m2 cache with unit-stride rows, heads % 8 == 0, D_ckv % 8 == 0,
// D_kpe % 8 == 0 (the kernel table checks the CPU: AVX2 and FMA).
MlaItemFn find_mla_kernel_avx2(const MlaParams& p);
// Whether this CPU and OS run AMX-BF16 tiles (CpuFeatures::amx_bf16; the bench judges bf16 MLA
// against the AMX peak then).
bool mla_amx_active();
// The tile kernels' e4m3 -> bf16 widening (mla_e4m3.h), for its exhaustive test; needs AVX-512
// (BW) and is absent (returns false) in builds without the x86 kernels.
bool mla_e4m3_to_bf16(const uint8_t* codes, int n, uint16_t* bf16);
// The portable f32 kernel (any dtype and stride).
void mla_item_portable(const MlaParams& p, const WorkItem& w, float* o, float* lse,
                       std::byte* scratch);

Status plan_mla(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                Plan* plan);
Status run_mla(const Plan& plan, const AttentionArgs& args, void* workspace,
               std::size_t workspace_bytes);

}  // namespace kvattn::cpu
