#include "cuda/common/problem_layout.h"

namespace kvattn::cuda {
namespace {

int32_t read_i32(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

}  // namespace

RequestStarts request_starts(const Problem& p, const AttentionArgs& args) {
  RequestStarts s;
  s.q_row.assign(p.batch_size, 0);
  s.kv_first.assign(p.batch_size, 0);
  for (int b = 0; b < p.batch_size; ++b) {
    switch (p.op) {
      case Op::kSingleDecode:
      case Op::kSinglePrefill:
        break;
      case Op::kBatchDecode:
        s.q_row[b] = b;
        s.kv_first[b] = read_i32(args.kv_indptr, b);
        break;
      case Op::kBatchPrefillPaged:
      case Op::kBatchPrefillRagged:
      case Op::kBatchMLAPaged:  // not run on fa2 or fa3 (their capabilities declare MLA unsupported)
        s.q_row[b] = read_i32(args.qo_indptr, b);
        s.kv_first[b] = read_i32(args.kv_indptr, b);
        break;
    }
  }
  return s;
}

}  // namespace kvattn::cuda
