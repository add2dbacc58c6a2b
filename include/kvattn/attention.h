// The attention API: describe the problem, give the tensors, plan once per step, run per layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvattn/device.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"
#include "kvattn/tensor.h"

namespace kvattn {

// The base of the log-sum-exp written to AttentionArgs::lse: natural (the C++ API's), or 2
// (FlashInfer's Python convention: the natural LSE times log2 e). Applied where each kernel stores
// the final LSE; split-KV partial states stay natural.
enum class LseBase { kE, k2 };

// The values a layer may change from one run of a plan to the next (DESIGN.md "Plans and
// per-layer values"): read by run, never by selection or planning.
struct RunScalars {
  // Dequantization scales: real = stored * scale. k_scale / v_scale stay 1 where per-head or
  // per-(token, head) scale tensors carry the scales; batch_mla_paged reads k_scale only (it
  // scales both latents).
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  LseBase lse_base = LseBase::kE;
};

// The tensors of one attention call. Which fields are used depends on Problem::op; the rest stay
// empty. Page tables and indptrs are int32. For the CPU backend everything is host memory.
struct AttentionArgs {
  // single_decode [H_qo, D_qk]; batch_decode [B, H_qo, D_qk]; the rest [N, H_qo, D_qk].
  TensorView q;
  // single ops: [kv_len, H_kv, D] (NHD) or [H_kv, kv_len, D] (HND);
  // batch_prefill_ragged: [kv_indptr[B], H_kv, D] (always NHD, as in FlashInfer).
  TensorView k, v;
  // Paged ops: [num_pages, page_size, H_kv, D] (NHD) or [num_pages, H_kv, page_size, D] (HND).
  // A combined [P, 2, ...] cache is passed as two strided views.
  TensorView paged_k_cache, paged_v_cache;
  TensorView qo_indptr;         // batch_prefill_*: [B+1]
  TensorView kv_indptr;         // paged: page indptr [B+1]; ragged: token indptr [B+1]
  TensorView kv_indices;        // paged: [kv_indptr[B]] page ids
  TensorView kv_last_page_len;  // paged: [B]
  // MaskMode::kCustom: u8. Unpacked: one byte (0/1) per (i, j), per request row-major
  // qo_len x kv_len, requests concatenated. Packed: the same bits, little-endian within a byte,
  // each request starting at a byte boundary (FlashInfer's segment_packbits).
  TensorView custom_mask;
  bool custom_mask_packed = false;
  // ALiBi slopes [H_qo] f32; empty = the standard slopes.
  TensorView alibi_slopes;
  // Attention sinks, one logit per query head, f32 [H_qo]: given by a plan whose problem says
  // use_sinks (or whose backend has sinks); empty: this layer runs without.
  TensorView sinks;
  // Per-head K/V scales, f32 [H_kv] each: kv_scale_granularity per_head, or a per_tensor plan
  // whose backend declares per_head scales (this layer's scales differ between heads).
  TensorView k_scale, v_scale;
  // per_token_head: f32, addressed like the K/V slot each scales: paged [num_pages, page_size,
  // H_kv] (NHD and HND caches alike); ragged [kv_indptr[B], H_kv]; single ops [kv_len, H_kv].
  TensorView k_scale_cache, v_scale_cache;
  // batch_mla_paged only (q, k, v and the paged K/V caches stay empty): q_nope [N, H, D_ckv] and
  // q_pe [N, H, D_kpe] in q_dtype; ckv_cache [P, page_size, D_ckv] and kpe_cache
  // [P, page_size, D_kpe] in kv_dtype, paged by kv_indptr / kv_indices / kv_last_page_len;
  // qo_indptr [B+1]; out [N, H, D_ckv].
  TensorView q_nope, q_pe;
  TensorView ckv_cache, kpe_cache;
  // Outputs: out [N, H_qo, D_vo] (single_decode [H_qo, D_vo]); lse f32 [N, H_qo] (single_decode
  // [H_qo]), any strides, in scalars.lse_base: given = the LSE is returned; empty = it is not.
  TensorView out;
  TensorView lse;
  // This layer's scales and LSE base.
  RunScalars scalars;
};

// One unit of work of a plan: a range of query rows of one request and KV head against a range
// of its keys. Items whose request is split over several KV chunks write partial states that a
// merge combines; `partial` is then the index of the chunk (else -1).
struct WorkItem {
  int32_t request = 0;
  int32_t kv_head = 0;
  int32_t qo_begin = 0, qo_end = 0;  // query rows within the request
  int64_t kv_begin = 0, kv_end = 0;  // keys within the request
  int32_t partial = -1;
};

struct PlanOptions {
  std::string backend = "auto";  // auto | reference | cpu | fa2 | fa3
  Device device = Device::cpu();
  int num_threads = 0;        // 0: all cores
  int64_t kv_chunk_size = 0;  // split-KV chunk in tokens; 0: the planner decides
  // CUDA backends: the stream (a cudaStream_t) that plan's copies and every launch of run() go
  // to; null is the legacy default stream. run() issues nothing but kernel launches on it (no
  // allocation, copy or synchronization), so it can be captured in a CUDA graph. A backend that
  // cannot honour a stream (the CPU backends, fa3 for now) refuses a non-null one; "auto" then
  // takes the next usable backend of the priority list that can.
  void* stream = nullptr;
};

// A plan is plain data made on the host, reused across all layers of a step: which backend,
// and how the work is cut.
struct Plan {
  std::string backend;
  Device device;
  Problem problem;
  int num_threads = 1;
  // The kernel chosen at plan time, which run() calls (cpu: a name from its kernel table, as
  // `kvattn explain` shows it); empty for a backend that does not name one.
  std::string kernel;
  int64_t kv_chunk_size = 0;  // 0: no split
  std::vector<WorkItem> work;
  std::vector<int64_t> kv_len;      // per request
  std::vector<int64_t> qo_len;      // per request
  int64_t num_partial_states = 0;   // partial (o, lse) rows the split writes before merging
  std::size_t workspace_bytes = 0;  // what run() needs
  void* stream = nullptr;           // PlanOptions::stream; run() launches on it
  // State the backend made at plan time, shared by every copy of the plan and freed with the
  // last one (fa2: its persistent device workspace: schedule, page table copy, split-KV partial
  // states, device_workspace_bytes on the plan's device). Runs of one plan must not overlap in
  // time (they share the partial states): issue them on one stream, or order them.
  std::shared_ptr<const void> backend_state;
  std::size_t device_workspace_bytes = 0;
};

// Chooses the backend (PlanOptions::backend), validates the problem against the arguments and
// cuts the work. Only the index tensors of `args` are read (host memory). For the batch
// operations the data tensors (q, out, k, v, the caches, lse) may be left empty: those given are
// validated, run() validates all of them (page ids against the cache's page count included).
Status plan(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
            Plan* out);

// Runs a plan. `workspace` must hold plan.workspace_bytes (may be null when that is 0, or to let
// kvattn allocate it for this call).
Status run(const Plan& plan, const AttentionArgs& args, void* workspace = nullptr,
           std::size_t workspace_bytes = 0);

// plan + run in one call.
Status run(const Problem& problem, const AttentionArgs& args, const PlanOptions& options = {});

// Options for the operations that are not attention.
struct OpOptions {
  std::string backend = "auto";
  Device device = Device::cpu();
  int num_threads = 0;
  // CUDA backends: the stream (a cudaStream_t) of every allocation, copy and launch; null is the
  // legacy default stream. The CPU backends refuse a non-null one.
  void* stream = nullptr;
};

// (o_a, lse_a) ⊕ (o_b, lse_b): v_* [N, H, D], s_* f32 [N, H]. -inf states are identities.
Status merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                   const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                   const OpOptions& options = {});
// Merges S states per row: v [N, S, H, D], s f32 [N, S, H] -> v_out [N, H, D], s_out [N, H]
// (s_out may be empty).
Status merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                    const TensorView& s_out, const OpOptions& options = {});

// The paged cache as append_paged_kv_cache sees it.
struct PagedKVCache {
  TensorView k_cache, v_cache;  // [P, page_size, H_kv, D] (NHD) or [P, H_kv, page_size, D] (HND)
  TensorView kv_indptr, kv_indices, kv_last_page_len;
  KVLayout layout = KVLayout::kNHD;
  float k_scale = 1.0f, v_scale = 1.0f;  // stored = round(real / scale) for fp8 caches
  // per_tensor: the floats above. per_token_head (fp8 caches): each appended (token, head) row
  // gets scale = amax|x| / fp8_max (1 when amax is 0), stored in k/v_scale_cache
  // [P, page_size, H_kv] (both layouts) at the row's slot, and the row is stored divided by it.
  // per_head is rejected here (kNotSupported): append's per-tensor floats cover one head's scale.
  KVScaleGranularity scale_granularity = KVScaleGranularity::kPerTensor;
  TensorView k_scale_cache, v_scale_cache;
};
// batch_indices[i] == kPaddedAppendRow marks a padded row (FlashInfer's convention: engines size
// the append arrays for the largest step): it writes nothing, and its position is not read.
inline constexpr int32_t kPaddedAppendRow = -1;
// Writes append_k/v [nnz, H_kv, D] at (batch_indices[i], positions[i]) of the paged cache,
// converting (and for fp8 quantizing, saturating) to the cache dtype. Rows whose batch index is
// kPaddedAppendRow are skipped; any other negative index is an error.
Status append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                             const TensorView& batch_indices, const TensorView& positions,
                             const PagedKVCache& cache, const OpOptions& options = {});

// Llama 3.1 frequency scaling (FlashInfer's apply_llama31_rope): each frequency f is divided by
// rope_scale by an amount that depends on its wavelength 2*pi/f, and the position is not scaled.
struct Llama31Scaling {
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  float old_context_len = 8192.0f;
};
struct RopeParams {
  float rope_theta = 1e4f;
  float rope_scale = 1.0f;
  bool interleave = false;
  // Dims [0, rotary_dim) rotate, the rest pass through; 0 means the whole head dim.
  int rotary_dim = 0;
  std::optional<Llama31Scaling> llama31;
  // f32 [max_position, rotary_dim] (vLLM / SGLang form): row p holds cos of pair t in column t
  // and its sin in column rotary_dim/2 + t. When given, theta, scale and llama31 are unused.
  TensorView cos_sin_cache;
};
// Rotates q [nnz, H_qo, D] and k [nnz, H_kv, D] at positions pos_ids [nnz] (int32), writing
// q_out / k_out (which may be q / k themselves, or empty to skip that tensor). Pair t of
// rotary_dim R is (x[t], x[t + R/2]), or (x[2t], x[2t+1]) interleaved, rotated by pos * f_t with
// f_t = theta^(-2t/R) / rope_scale, by the llama31-scaled f_t, or by the cache's row pos.
Status apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                  const TensorView& k_out, const TensorView& pos_ids, const RopeParams& rope,
                  const OpOptions& options = {});

}  // namespace kvattn
