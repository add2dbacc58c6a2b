// The random case fa2's correctness tests start from (the GPU tests and the CPU replay of the
// kernel body): a problem with a kernel key's dtypes and head dims, 16-token pages, and a scaled
// FP8 cache when the key's cache is FP8 (as an engine keeps one: the scales are folded into the
// kernel).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/fa2/kernel_key.h"
#include "testing/case_builder.h"

namespace kvattn::fa2 {

inline testing::CaseSpec fa2_case_spec(const KernelKey& key, Op op, std::vector<int64_t> qo,
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
  if (is_fp8(key.kv)) {
    s.problem.k_scale = 0.5f;
    s.problem.v_scale = 2.0f;
  }
  return s;
}

}  // namespace kvattn::fa2
