// The random case the CUDA backends' correctness tests start from (fa2's and fa3's GPU tests and
// the CPU replays of their kernel bodies): a problem with a kernel key's dtypes and head dims,
// 16-token pages; an FP8 cache scaled, and an FP8 query (fa3) scaled with bf16 output, as an
// engine keeps them (the scales are folded into the kernel).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/common/kernel_key.h"
#include "testing/case_builder.h"

namespace kvattn::cuda {

inline testing::CaseSpec kernel_case_spec(const KernelKey& key, Op op, std::vector<int64_t> qo,
                                          std::vector<int64_t> kv, int qo_heads, int kv_heads) {
  testing::CaseSpec s;
  s.problem.op = op;
  s.problem.batch_size = int(kv.size());
  s.problem.num_qo_heads = qo_heads;
  s.problem.num_kv_heads = kv_heads;
  s.problem.head_dim_qk = key.head_dim_qk;
  s.problem.head_dim_vo = key.head_dim_vo;
  s.problem.q_dtype = key.q;
  s.problem.kv_dtype = key.kv;
  s.problem.o_dtype = key.q;
  s.problem.page_size = 16;
  s.qo_lens = std::move(qo);
  s.kv_lens = std::move(kv);
  if (is_fp8(key.q)) {
    s.problem.o_dtype = DType::kBF16;
    s.scalars.q_scale = 0.25f;
  }
  if (is_fp8(key.kv)) {
    s.scalars.k_scale = 0.5f;
    s.scalars.v_scale = 2.0f;
  }
  return s;
}

}  // namespace kvattn::cuda
