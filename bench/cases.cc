#include "bench/cases.h"

namespace kvattn::bench {
namespace {

// Llama-3-8B attention: 32 query heads, 8 KV heads, head dim 128, pages of 16 tokens.
testing::CaseSpec llama3_decode(DType kv, int head_dim, int batch, int64_t context) {
  testing::CaseSpec spec;
  Problem& p = spec.problem;
  p.op = Op::kBatchDecode;
  p.batch_size = batch;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim_qk = p.head_dim_vo = head_dim;
  p.page_size = 16;
  p.q_dtype = DType::kBF16;
  p.kv_dtype = kv;
  p.o_dtype = DType::kBF16;
  spec.kv_lens.assign(batch, context);
  spec.extra_pages = 0;
  spec.nan_fill_outputs = false;
  return spec;
}

// Ragged Q over a paged KV cache, `batch` requests of `tokens` new tokens each, causal.
testing::CaseSpec llama3_prefill(int head_dim, int64_t tokens, int batch = 1) {
  testing::CaseSpec spec = llama3_decode(DType::kBF16, head_dim, batch, tokens);
  spec.problem.op = Op::kBatchPrefillPaged;
  spec.problem.mask_mode = MaskMode::kCausal;
  spec.qo_lens.assign(batch, tokens);
  return spec;
}

// A speculative-decoding check: `batch` requests of `context` cached tokens, the last `tokens` of
// which are the draft tokens being verified (the queries), causal.
testing::CaseSpec spec_verify(int64_t tokens, int batch, int64_t context) {
  testing::CaseSpec spec = llama3_decode(DType::kBF16, 128, batch, context);
  spec.problem.op = Op::kBatchPrefillPaged;
  spec.problem.mask_mode = MaskMode::kCausal;
  spec.qo_lens.assign(batch, tokens);
  return spec;
}

testing::CaseSpec with_layout(testing::CaseSpec spec, KVLayout layout) {
  spec.problem.kv_layout = layout;
  return spec;
}

testing::CaseSpec with_heads(testing::CaseSpec spec, int qo_heads, int kv_heads) {
  spec.problem.num_qo_heads = qo_heads;
  spec.problem.num_kv_heads = kv_heads;
  return spec;
}

testing::CaseSpec with_granularity(testing::CaseSpec spec, KVScaleGranularity g) {
  spec.problem.kv_scale_granularity = g;
  return spec;
}

// MLA decode (DeepSeek-V3: 128 heads, latent 512 + 64, pages of 64 as FlashMLA uses).
testing::CaseSpec mla_decode(DType kv, int heads, int batch, int64_t context) {
  testing::CaseSpec spec;
  spec.problem = make_mla_problem(batch, heads, /*page_size=*/64, /*sm_scale=*/0.1352f);
  spec.problem.kv_dtype = kv;
  if (is_fp8(kv)) spec.scalars.k_scale = 0.0625f;
  spec.qo_lens.assign(batch, 1);  // decode: one new token per request
  spec.kv_lens.assign(batch, context);
  spec.extra_pages = 0;
  spec.nan_fill_outputs = false;
  return spec;
}

}  // namespace

std::vector<BenchCase> standard_cases() {
  return {
      // 16 x 4096 tokens x 8 heads x 128 x 2 (K, V) x 2 bytes = 268 MB: 8x the 32 MiB L3.
      {"decode_llama3_8b_bf16", llama3_decode(DType::kBF16, 128, 16, 4096), true},
      {"decode_llama3_8b_e4m3", llama3_decode(DType::kE4M3, 128, 16, 4096), true},
      // Issue 11: the same decode with one fp32 K and V scale per (token, head) beside the cache
      // (goal: <= 1.1x the per-tensor e4m3 decode above).
      {"decode_llama3_8b_e4m3_per_token_head",
       with_granularity(llama3_decode(DType::kE4M3, 128, 16, 4096),
                        KVScaleGranularity::kPerTokenHead),
       true},
      // Issue 14: f16 KV within 10 % of bf16 KV, the HND layout within 10 % of NHD.
      {"decode_llama3_8b_f16", llama3_decode(DType::kF16, 128, 16, 4096), true},
      {"decode_llama3_8b_bf16_hnd",
       with_layout(llama3_decode(DType::kBF16, 128, 16, 4096), KVLayout::kHND), true},
      {"decode_long_b1", llama3_decode(DType::kBF16, 128, 1, 32768), true},
      {"decode_d64_bf16", llama3_decode(DType::kBF16, 64, 16, 4096), true},
      {"decode_d256_bf16", llama3_decode(DType::kBF16, 256, 16, 4096), true},
      // Other models' heads over the same 268 MB: MHA (Llama-2-7B, Phi-3-mini: 32 KV heads of one
      // query each; token rows of 8 KiB) and GQA 7 (Qwen2.5-7B: 28 query heads over 4 KV heads,
      // padded to blocks of 8 rows).
      {"decode_mha_bf16", with_heads(llama3_decode(DType::kBF16, 128, 16, 1024), 32, 32), true},
      {"decode_gqa7_bf16", with_heads(llama3_decode(DType::kBF16, 128, 16, 8192), 28, 4), true},
      // Many short contexts (64 x 256 tokens, 67 MB): what each request costs besides its keys
      // (its queries in, its outputs out) weighs here, where the long cases hide it.
      {"decode_short_b64_bf16", llama3_decode(DType::kBF16, 128, 64, 256), true},
      {"prefill_llama3_8b_causal", llama3_prefill(128, 4096), false},
      {"prefill_d64_causal", llama3_prefill(64, 4096), false},
      {"prefill_d256_causal", llama3_prefill(256, 4096), false},
      // Many short prompts (64 x 128 tokens): each query tile meets 32-128 keys, so what a tile
      // costs besides its products (its queries in, its outputs out: 64 MiB each way) weighs here.
      {"prefill_short_b64_causal", llama3_prefill(128, 128, 64), false},
      // Speculative decoding's check of 4 draft tokens a request over decode_llama3_8b_bf16's
      // cache (268 MB): 16 query rows a KV head, judged by DRAM bandwidth like the decode it
      // stands in for (its arithmetic at the bf16 dot peak takes about as long as the read).
      {"prefill_spec4_b16_causal", spec_verify(4, 16, 4096), true},
      // MLA: 16 x 4096 latents x 576 x 2 bytes = 75 MB read once for all heads; at 128 heads
      // each latent meets 128 query rows (~2 kFLOP per byte): compute-bound on bf16 dot products.
      // At 16 heads (DeepSeek-V2-Lite) it is 8x less compute per byte: judged by DRAM bandwidth.
      {"mla_decode_deepseek_v3_bf16", mla_decode(DType::kBF16, 128, 16, 4096), false, true},
      {"mla_decode_deepseek_v3_e4m3", mla_decode(DType::kE4M3, 128, 16, 4096), false, true},
      {"mla_decode_h16_bf16", mla_decode(DType::kBF16, 16, 16, 4096), true},
  };
}

}  // namespace kvattn::bench
