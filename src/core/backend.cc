#include "core/backend.h"

#include "core/status_macros.h"

namespace kvattn {
namespace {

int32_t read_i32(const TensorView& t, int64_t i) {
  return static_cast<const int32_t*>(t.data)[i * t.strides[0]];
}

Status no_aux(const Backend& b, std::string_view what) {
  return make_error(ErrorCode::kNotSupported, "backend ", b.name(), " does not implement ", what);
}

}  // namespace

void request_lengths(const Problem& p, const AttentionArgs& args, std::vector<int64_t>* qo_len,
                     std::vector<int64_t>* kv_len) {
  const int batch = p.batch_size;
  qo_len->assign(batch, 0);
  kv_len->assign(batch, 0);
  switch (p.op) {
    case Op::kSingleDecode:
      (*qo_len)[0] = 1;
      (*kv_len)[0] = p.kv_layout == KVLayout::kNHD ? args.k.shape[0] : args.k.shape[1];
      return;
    case Op::kSinglePrefill:
      (*qo_len)[0] = args.q.shape[0];
      (*kv_len)[0] = p.kv_layout == KVLayout::kNHD ? args.k.shape[0] : args.k.shape[1];
      return;
    case Op::kBatchDecode:
    case Op::kBatchPrefillPaged:
    case Op::kBatchMLAPaged:
      for (int b = 0; b < batch; ++b) {
        (*qo_len)[b] = p.op == Op::kBatchDecode
                           ? 1
                           : read_i32(args.qo_indptr, b + 1) - read_i32(args.qo_indptr, b);
        int64_t pages = read_i32(args.kv_indptr, b + 1) - read_i32(args.kv_indptr, b);
        (*kv_len)[b] =
            pages == 0 ? 0 : (pages - 1) * p.page_size + read_i32(args.kv_last_page_len, b);
      }
      return;
    case Op::kBatchPrefillRagged:
      for (int b = 0; b < batch; ++b) {
        (*qo_len)[b] = read_i32(args.qo_indptr, b + 1) - read_i32(args.qo_indptr, b);
        (*kv_len)[b] = read_i32(args.kv_indptr, b + 1) - read_i32(args.kv_indptr, b);
      }
      return;
  }
}

Status Backend::plan(const Problem& problem, const AttentionArgs& args, const PlanOptions& options,
                     Plan* plan) const {
  plan->backend = std::string(name());
  plan->device = options.device;
  plan->stream = options.stream;
  plan->problem = problem;
  plan->num_threads = 1;
  plan->kv_chunk_size = 0;
  plan->num_partial_states = 0;
  plan->workspace_bytes = 0;
  request_lengths(problem, args, &plan->qo_len, &plan->kv_len);
  plan->work.clear();
  for (int b = 0; b < problem.batch_size; ++b) {
    for (int h = 0; h < problem.num_kv_heads; ++h) {
      WorkItem w;
      w.request = b;
      w.kv_head = h;
      w.qo_begin = 0;
      w.qo_end = static_cast<int32_t>(plan->qo_len[b]);
      w.kv_begin = 0;
      w.kv_end = plan->kv_len[b];
      plan->work.push_back(w);
    }
  }
  return Status::Ok();
}

Status Backend::merge_state(const TensorView&, const TensorView&, const TensorView&,
                            const TensorView&, const TensorView&, const TensorView&,
                            const OpOptions&) const {
  return no_aux(*this, "merge_state");
}
Status Backend::merge_states(const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&, const OpOptions&) const {
  return no_aux(*this, "merge_states");
}
Status Backend::append_paged_kv_cache(const TensorView&, const TensorView&, const TensorView&,
                                      const TensorView&, const PagedKVCache&,
                                      const OpOptions&) const {
  return no_aux(*this, "append_paged_kv_cache");
}
Status Backend::apply_rope(const TensorView&, const TensorView&, const TensorView&,
                           const TensorView&, const TensorView&, const RopeParams&,
                           const OpOptions&) const {
  return no_aux(*this, "apply_rope");
}

}  // namespace kvattn
