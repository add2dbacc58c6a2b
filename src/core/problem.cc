#include "kvattn/problem.h"

#include <charconv>
#include <cmath>
#include <sstream>

namespace kvattn {
namespace {

template <class E, std::size_t N>
std::optional<E> parse_from(const std::pair<E, std::string_view> (&table)[N],
                            std::string_view name) {
  for (const auto& [e, n] : table) {
    if (n == name) return e;
  }
  return std::nullopt;
}
template <class E, std::size_t N>
std::string_view name_from(const std::pair<E, std::string_view> (&table)[N], E value) {
  for (const auto& [e, n] : table) {
    if (e == value) return n;
  }
  return "?";
}

constexpr std::pair<Op, std::string_view> kOps[] = {
    {Op::kSingleDecode, "single_decode"},
    {Op::kSinglePrefill, "single_prefill"},
    {Op::kBatchDecode, "batch_decode"},
    {Op::kBatchPrefillPaged, "batch_prefill_paged"},
    {Op::kBatchPrefillRagged, "batch_prefill_ragged"},
    {Op::kBatchMLAPaged, "batch_mla_paged"},
};
constexpr std::pair<KVLayout, std::string_view> kLayouts[] = {{KVLayout::kNHD, "NHD"},
                                                              {KVLayout::kHND, "HND"}};
constexpr std::pair<MaskMode, std::string_view> kMasks[] = {
    {MaskMode::kNone, "none"}, {MaskMode::kCausal, "causal"}, {MaskMode::kCustom, "custom"}};
constexpr std::pair<PosEncoding, std::string_view> kPos[] = {{PosEncoding::kNone, "NONE"},
                                                             {PosEncoding::kRopeLlama, "ROPE_LLAMA"},
                                                             {PosEncoding::kAlibi, "ALIBI"}};
constexpr std::pair<KVScaleGranularity, std::string_view> kGranularities[] = {
    {KVScaleGranularity::kPerTensor, "per_tensor"},
    {KVScaleGranularity::kPerHead, "per_head"},
    {KVScaleGranularity::kPerTokenHead, "per_token_head"}};

// The shortest decimal that reads back as the same float, so printed flags replay exactly.
std::string shortest(float value) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(value);
}

}  // namespace

std::string_view op_name(Op op) { return name_from(kOps, op); }
std::optional<Op> parse_op(std::string_view name) { return parse_from(kOps, name); }
std::string_view kv_layout_name(KVLayout l) { return name_from(kLayouts, l); }
std::optional<KVLayout> parse_kv_layout(std::string_view name) {
  return parse_from(kLayouts, name);
}
std::string_view mask_mode_name(MaskMode m) { return name_from(kMasks, m); }
std::optional<MaskMode> parse_mask_mode(std::string_view name) {
  return parse_from(kMasks, name);
}
std::string_view pos_encoding_name(PosEncoding p) { return name_from(kPos, p); }
std::optional<PosEncoding> parse_pos_encoding(std::string_view name) {
  return parse_from(kPos, name);
}

std::string_view kv_scale_granularity_name(KVScaleGranularity g) {
  return name_from(kGranularities, g);
}
std::optional<KVScaleGranularity> parse_kv_scale_granularity(std::string_view name) {
  return parse_from(kGranularities, name);
}

float Problem::effective_sm_scale() const {
  if (sm_scale) return *sm_scale;
  return head_dim_qk > 0 ? 1.0f / std::sqrt(static_cast<float>(head_dim_qk)) : 1.0f;
}

std::string Problem::to_string() const {
  std::ostringstream os;
  os << "--op " << op_name(op) << " --batch-size " << batch_size << " --num-qo-heads "
     << num_qo_heads;
  if (is_mla(op)) {
    os << " --head-dim-ckv " << head_dim_ckv << " --head-dim-kpe " << head_dim_kpe
       << " --page-size " << page_size;
  } else {
    os << " --num-kv-heads " << num_kv_heads << " --head-dim-qk " << head_dim_qk
       << " --head-dim-vo " << head_dim_vo;
    if (is_paged(op)) os << " --page-size " << page_size;
    os << " --kv-layout " << kv_layout_name(kv_layout);
  }
  os << " --q-data-type " << dtype_name(q_dtype) << " --kv-data-type " << dtype_name(kv_dtype)
     << " --o-data-type " << dtype_name(o_dtype);
  if (mask_mode == MaskMode::kCausal) os << " --causal";
  if (mask_mode == MaskMode::kCustom) os << " --custom-mask";
  if (window_left >= 0) os << " --window-left " << window_left;
  if (logits_soft_cap > 0) os << " --logits-soft-cap " << shortest(logits_soft_cap);
  if (sm_scale) os << " --sm-scale " << shortest(*sm_scale);
  if (pos_encoding_mode != PosEncoding::kNone) {
    os << " --pos-encoding-mode " << pos_encoding_name(pos_encoding_mode);
  }
  if (pos_encoding_mode == PosEncoding::kRopeLlama) {
    os << " --rope-theta " << shortest(rope_theta) << " --rope-scale " << shortest(rope_scale);
    if (rope_interleave) os << " --rope-interleave";
  }
  if (kv_scale_granularity != KVScaleGranularity::kPerTensor) {
    os << " --kv-scale-granularity " << kv_scale_granularity_name(kv_scale_granularity);
  }
  if (use_sinks) os << " --use-sinks";
  if (use_fp16_qk_reduction) os << " --use-fp16-qk-reduction";
  return os.str();
}

Problem make_mla_problem(int batch_size, int num_qo_heads, int page_size, float sm_scale,
                         int head_dim_ckv, int head_dim_kpe) {
  Problem p;
  p.op = Op::kBatchMLAPaged;
  p.batch_size = batch_size;
  p.num_qo_heads = num_qo_heads;
  p.page_size = page_size;
  p.sm_scale = sm_scale;
  p.head_dim_ckv = head_dim_ckv;
  p.head_dim_kpe = head_dim_kpe;
  derive_mla_fields(&p);
  return p;
}

void derive_mla_fields(Problem* p) {
  if (!is_mla(p->op)) return;
  p->num_kv_heads = 1;
  p->head_dim_qk = p->head_dim_ckv + p->head_dim_kpe;
  p->head_dim_vo = p->head_dim_ckv;
  p->kv_layout = KVLayout::kNHD;
}

double alibi_slope(int head, int num_heads) {
  int n = 1;
  while (n * 2 <= num_heads) n *= 2;
  if (head < n) return std::exp2(-8.0 * (head + 1) / n);
  return std::exp2(-4.0 * (2 * (head - n) + 1) / n);
}

}  // namespace kvattn
