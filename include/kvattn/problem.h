// What to compute: a value type that selection, planning and every backend read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvattn/dtype.h"

namespace kvattn {

enum class Op {
  kSingleDecode,        // q [H_qo, D_qk], k/v [kv_len, H_kv, D] (NHD) or [H_kv, kv_len, D] (HND)
  kSinglePrefill,       // q [qo_len, H_qo, D_qk], k/v as single decode
  kBatchDecode,         // q [B, H_qo, D_qk] over a paged cache
  kBatchPrefillPaged,   // ragged q [qo_indptr[B], H_qo, D_qk] over a paged cache
  kBatchPrefillRagged,  // ragged q over ragged k/v [kv_indptr[B], H_kv, D]
  // MLA (DESIGN.md §2): ragged q_nope/q_pe [qo_indptr[B], H, D_ckv / D_kpe] over paged latent
  // caches ckv [P, page_size, D_ckv] and kpe [P, page_size, D_kpe] shared by all heads.
  kBatchMLAPaged,
};
std::string_view op_name(Op op);  // "single_decode", ... as the command line spells them
std::optional<Op> parse_op(std::string_view name);
inline bool is_decode(Op op) { return op == Op::kSingleDecode || op == Op::kBatchDecode; }
inline bool is_paged(Op op) { return op == Op::kBatchDecode || op == Op::kBatchPrefillPaged; }
inline bool is_batch(Op op) { return op != Op::kSingleDecode && op != Op::kSinglePrefill; }
// MLA reads its own tensors (q_nope, q_pe, ckv_cache, kpe_cache), not q / k / v: it is neither
// is_paged nor is_decode, though its caches are paged and its queries ragged.
inline bool is_mla(Op op) { return op == Op::kBatchMLAPaged; }

enum class KVLayout { kNHD, kHND };
std::string_view kv_layout_name(KVLayout layout);  // "NHD", "HND"
std::optional<KVLayout> parse_kv_layout(std::string_view name);

enum class MaskMode { kNone, kCausal, kCustom };
std::string_view mask_mode_name(MaskMode mode);  // "none", "causal", "custom"
std::optional<MaskMode> parse_mask_mode(std::string_view name);

enum class PosEncoding { kNone, kRopeLlama, kAlibi };
std::string_view pos_encoding_name(PosEncoding p);  // "NONE", "ROPE_LLAMA", "ALIBI"
std::optional<PosEncoding> parse_pos_encoding(std::string_view name);

// How FP8 K/V dequantization scales are given (DESIGN.md §2, FP8 scale granularity).
//   per_tensor: RunScalars::k_scale / v_scale (floats, AttentionArgs::scalars); a run may still
//     pass per-head tensors where the plan's backend declares per_head scales.
//   per_head: AttentionArgs::k_scale / v_scale, f32 [H_kv].
//   per_token_head: AttentionArgs::k_scale_cache / v_scale_cache, f32 [num_pages, page_size, H_kv]
//     beside a paged cache (for both NHD and HND caches), [nnz_kv, H_kv] beside ragged K/V and
//     [kv_len, H_kv] beside the single ops' K/V (for both layouts), addressed like the slot they
//     scale.
// Outside per_tensor the float k_scale / v_scale must stay 1 (the tensors carry the scales).
enum class KVScaleGranularity { kPerTensor, kPerHead, kPerTokenHead };
std::string_view kv_scale_granularity_name(KVScaleGranularity g);  // "per_tensor", ...
std::optional<KVScaleGranularity> parse_kv_scale_granularity(std::string_view name);

struct Problem {
  Op op = Op::kBatchDecode;
  int batch_size = 1;  // 1 for the single operations
  int num_qo_heads = 32;
  int num_kv_heads = 8;
  int head_dim_qk = 128;
  int head_dim_vo = 128;
  int page_size = 16;  // paged operations only
  KVLayout kv_layout = KVLayout::kNHD;

  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  DType o_dtype = DType::kBF16;

  MaskMode mask_mode = MaskMode::kNone;  // causal or a custom mask (given with the arguments)
  int window_left = -1;                  // < 0: no sliding window
  float logits_soft_cap = 0.0f;          // <= 0: no soft cap
  std::optional<float> sm_scale;         // default 1/sqrt(head_dim_qk)

  PosEncoding pos_encoding_mode = PosEncoding::kNone;
  float rope_theta = 1e4f;
  float rope_scale = 1.0f;
  bool rope_interleave = false;  // pairs (x[2t], x[2t+1]) instead of (x[t], x[t+D/2])

  // How the K/V dequantization scales are given. The scales themselves (q/k/v per tensor, the
  // per-head and per-(token, head) tensors) are per-layer run arguments (AttentionArgs).
  KVScaleGranularity kv_scale_granularity = KVScaleGranularity::kPerTensor;

  // Attention sinks (gpt-oss): a layer may pass AttentionArgs::sinks, f32 [H_qo], one logit per
  // query head that joins the softmax denominator and carries no value (DESIGN.md §2). Selection
  // picks only a backend that has sinks; a run without the tensor has none.
  bool use_sinks = false;

  bool use_fp16_qk_reduction = false;

  // MLA latent widths (batch_mla_paged only). An MLA problem also reads num_kv_heads = 1,
  // head_dim_qk = D_ckv + D_kpe, head_dim_vo = D_ckv, kv_layout NHD (make_mla_problem sets them;
  // validation holds them to it) so that shape-generic code sees one shared KV head.
  int head_dim_ckv = 512;
  int head_dim_kpe = 64;

  int group_size() const { return num_kv_heads > 0 ? num_qo_heads / num_kv_heads : 0; }
  float effective_sm_scale() const;
  // One line, the command-line flags that reproduce the problem.
  std::string to_string() const;
};

// A batch_mla_paged problem with the derived fields set (num_kv_heads 1, head_dim_qk D_ckv +
// D_kpe, head_dim_vo D_ckv, NHD); dtypes bf16, no mask. sm_scale has no default for MLA.
Problem make_mla_problem(int batch_size, int num_qo_heads, int page_size, float sm_scale,
                         int head_dim_ckv = 512, int head_dim_kpe = 64);
// Sets the derived fields of an MLA problem from head_dim_ckv / head_dim_kpe (no-op otherwise).
void derive_mla_fields(Problem* problem);

// The standard ALiBi slope of head h among num_heads heads (DESIGN.md §2).
double alibi_slope(int head, int num_heads);

}  // namespace kvattn
