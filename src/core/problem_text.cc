#include "kvattn/problem_text.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace kvattn {
namespace {

using Kind = ProblemField::Kind;

constexpr std::string_view kFloatDTypes = "f32|f16|bf16|e4m3|e5m2";

bool set_dtype(std::string_view value, DType* out, std::string* why) {
  std::optional<DType> d = parse_dtype(value);
  if (!d || !is_float(*d)) {
    *why = std::string("expected ") + std::string(kFloatDTypes);
    return false;
  }
  *out = *d;
  return true;
}

bool set_positive_int(std::string_view value, int* out, std::string* why) {
  if (!parse_int(value, out) || *out <= 0) {
    *why = "expected a positive integer";
    return false;
  }
  return true;
}

bool set_nonnegative_int(std::string_view value, int* out, std::string* why) {
  if (!parse_int(value, out) || *out < 0) {
    *why = "expected an integer >= 0";
    return false;
  }
  return true;
}

bool set_float(std::string_view value, float* out, std::string* why) {
  if (!parse_float(value, out)) {
    *why = "expected a finite decimal number";
    return false;
  }
  return true;
}

bool set_bool(std::string_view value, bool* out, std::string* why) {
  if (!parse_bool(value, out)) {
    *why = "expected true or false";
    return false;
  }
  return true;
}

std::string bool_text(bool b) { return b ? "true" : "false"; }

// The table. Non-capturing lambdas keep each field's parse and print side by side.
const std::vector<ProblemField>& fields() {
  static const std::vector<ProblemField> table = {
      {"op", Kind::kText,
       "single_decode|single_prefill|batch_decode|batch_prefill_paged|batch_prefill_ragged|"
       "batch_mla_paged",
       "the operation",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         std::optional<Op> op = parse_op(v);
         if (!op) {
           *why =
               "expected single_decode, single_prefill, batch_decode, batch_prefill_paged, "
               "batch_prefill_ragged or batch_mla_paged";
           return false;
         }
         d->problem.op = *op;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::string(op_name(p.op));
       }},
      {"batch_size", Kind::kInt, "N", "requests in the batch (1 for the single operations)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_positive_int(v, &d->problem.batch_size, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::to_string(p.batch_size);
       }},
      {"num_qo_heads", Kind::kInt, "N", "query heads",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_positive_int(v, &d->problem.num_qo_heads, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::to_string(p.num_qo_heads);
       }},
      {"num_kv_heads", Kind::kInt, "N", "KV heads (num_qo_heads must be a multiple)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         if (!set_positive_int(v, &d->problem.num_kv_heads, why)) return false;
         d->num_kv_heads = d->problem.num_kv_heads;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         if (is_mla(p.op)) return std::nullopt;  // fixed by MLA
         return std::to_string(p.num_kv_heads);
       }},
      {"head_dim_qk", Kind::kInt, "N", "head dim of q and k",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         if (!set_positive_int(v, &d->problem.head_dim_qk, why)) return false;
         d->head_dim_qk = d->problem.head_dim_qk;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         if (is_mla(p.op)) return std::nullopt;  // fixed by MLA
         return std::to_string(p.head_dim_qk);
       }},
      {"head_dim_vo", Kind::kInt, "N", "head dim of v and o",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         if (!set_positive_int(v, &d->problem.head_dim_vo, why)) return false;
         d->head_dim_vo = d->problem.head_dim_vo;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         if (is_mla(p.op)) return std::nullopt;  // fixed by MLA
         return std::to_string(p.head_dim_vo);
       }},
      {"page_size", Kind::kInt, "N", "tokens per KV-cache page (paged operations)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_positive_int(v, &d->problem.page_size, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::to_string(p.page_size);
       }},
      {"kv_layout", Kind::kText, "NHD|HND", "KV layout",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         std::optional<KVLayout> l = parse_kv_layout(v);
         if (!l) {
           *why = "expected NHD or HND";
           return false;
         }
         d->problem.kv_layout = *l;
         d->kv_layout = *l;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         if (is_mla(p.op)) return std::nullopt;  // fixed by MLA
         return std::string(kv_layout_name(p.kv_layout));
       }},
      {"head_dim_ckv", Kind::kInt, "N",
       "MLA: width of the compressed latent ckv (DeepSeek-V3: 512)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_positive_int(v, &d->problem.head_dim_ckv, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         if (!is_mla(p.op)) return std::nullopt;
         return std::to_string(p.head_dim_ckv);
       }},
      {"head_dim_kpe", Kind::kInt, "N", "MLA: width of the RoPE part kpe (DeepSeek-V3: 64)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_nonnegative_int(v, &d->problem.head_dim_kpe, why);  // 0: no pe term
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         if (!is_mla(p.op)) return std::nullopt;
         return std::to_string(p.head_dim_kpe);
       }},
      {"causal", Kind::kBool, "", "causal mask (bottom-right aligned)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_bool(v, &d->causal, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return bool_text(p.mask_mode == MaskMode::kCausal);
       }},
      {"custom_mask", Kind::kBool, "",
       "a random custom mask (or the case file's custom_mask tensor)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_bool(v, &d->custom_mask, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return bool_text(p.mask_mode == MaskMode::kCustom);
       }},
      {"window_left", Kind::kInt, "N",
       "sliding window: keys at most N before the diagonal (-1: none)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         if (!parse_int(v, &d->problem.window_left) || d->problem.window_left < -1) {
           *why = "expected an integer >= -1";
           return false;
         }
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::to_string(p.window_left);
       }},
      {"logits_soft_cap", Kind::kFloat, "X", "soft cap c: s = c*tanh(s/c) (0: none)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_float(v, &d->problem.logits_soft_cap, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return format_float(p.logits_soft_cap);
       }},
      {"sm_scale", Kind::kFloat, "X", "score scale (default 1/sqrt(head_dim_qk))",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         float s = 0;
         if (!set_float(v, &s, why)) return false;
         d->problem.sm_scale = s;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         if (!p.sm_scale) return std::nullopt;
         return format_float(*p.sm_scale);
       }},
      {"pos_encoding_mode", Kind::kText, "NONE|ROPE_LLAMA|ALIBI", "position encoding fused in",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         std::optional<PosEncoding> pe = parse_pos_encoding(v);
         if (!pe) {
           *why = "expected NONE, ROPE_LLAMA or ALIBI";
           return false;
         }
         d->problem.pos_encoding_mode = *pe;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::string(pos_encoding_name(p.pos_encoding_mode));
       }},
      {"rope_theta", Kind::kFloat, "X", "RoPE base (default 10000)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_float(v, &d->problem.rope_theta, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return format_float(p.rope_theta);
       }},
      {"rope_scale", Kind::kFloat, "X", "RoPE position divisor (default 1)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_float(v, &d->problem.rope_scale, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return format_float(p.rope_scale);
       }},
      {"rope_interleave", Kind::kBool, "", "RoPE pairs (x[2t], x[2t+1]) instead of rotating halves",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_bool(v, &d->problem.rope_interleave, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return bool_text(p.rope_interleave);
       }},
      {"q_data_type", Kind::kText, kFloatDTypes, "query dtype",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_dtype(v, &d->problem.q_dtype, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::string(dtype_name(p.q_dtype));
       }},
      {"kv_data_type", Kind::kText, kFloatDTypes, "KV-cache dtype",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_dtype(v, &d->problem.kv_dtype, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::string(dtype_name(p.kv_dtype));
       }},
      {"o_data_type", Kind::kText, "f32|f16|bf16", "output dtype (default: q's, bf16 for an fp8 q)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         if (!set_dtype(v, &d->problem.o_dtype, why)) return false;
         d->o_dtype_given = true;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::string(dtype_name(p.o_dtype));
       }},
      // Per-layer run values (AttentionArgs::scalars): the command line and case files carry them
      // beside the problem; a Python Problem does not take them (run does).
      {"q_scale", Kind::kFloat, "X", "fp8 dequantization scale of q (real = stored * scale)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_float(v, &d->run.q_scale, why);
       },
       [](const Problem&, const RunValues& r) -> std::optional<std::string> {
         return format_float(r.q_scale);
       },
       true},
      {"k_scale", Kind::kFloat, "X", "fp8 dequantization scale of k",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_float(v, &d->run.k_scale, why);
       },
       [](const Problem&, const RunValues& r) -> std::optional<std::string> {
         return format_float(r.k_scale);
       },
       true},
      {"v_scale", Kind::kFloat, "X", "fp8 dequantization scale of v",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_float(v, &d->run.v_scale, why);
       },
       [](const Problem&, const RunValues& r) -> std::optional<std::string> {
         return format_float(r.v_scale);
       },
       true},
      {"kv_scale_granularity", Kind::kText, "per_tensor|per_head|per_token_head",
       "fp8 K/V scales per tensor, per KV head, or per (token, KV head)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         std::optional<KVScaleGranularity> g = parse_kv_scale_granularity(v);
         if (!g) {
           *why = "expected per_tensor, per_head or per_token_head";
           return false;
         }
         d->problem.kv_scale_granularity = *g;
         return true;
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return std::string(kv_scale_granularity_name(p.kv_scale_granularity));
       }},
      {"use_sinks", Kind::kBool, "", "attention sinks: one logit per query head (the sinks tensor)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_bool(v, &d->problem.use_sinks, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return bool_text(p.use_sinks);
       }},
      {"return_lse", Kind::kBool, "", "also write the log-sum-exp of every row (an lse tensor)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_bool(v, &d->run.return_lse, why);
       },
       [](const Problem&, const RunValues& r) -> std::optional<std::string> {
         return bool_text(r.return_lse);
       },
       true},
      {"use_fp16_qk_reduction", Kind::kBool, "", "reduce q.k in fp16 (fa2 only)",
       [](std::string_view v, ProblemDraft* d, std::string* why) {
         return set_bool(v, &d->problem.use_fp16_qk_reduction, why);
       },
       [](const Problem& p, const RunValues&) -> std::optional<std::string> {
         return bool_text(p.use_fp16_qk_reduction);
       }},
  };
  return table;
}

}  // namespace

std::span<const ProblemField> problem_fields() { return fields(); }

const ProblemField* find_problem_field(std::string_view key) {
  for (const ProblemField& f : fields()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

RunScalars RunValues::scalars() const {
  RunScalars s;
  s.q_scale = q_scale;
  s.k_scale = k_scale;
  s.v_scale = v_scale;
  return s;
}

std::string flag_for_key(std::string_view key) {
  std::string flag = "--";
  for (char c : key) flag += c == '_' ? '-' : c;
  return flag;
}

Status finish_problem(const ProblemDraft& draft, Problem* out) {
  Problem p = draft.problem;
  if (draft.causal && draft.custom_mask) {
    return Status(ErrorCode::kParseError,
                  "causal and custom_mask exclude each other (a custom mask may encode causality)");
  }
  p.mask_mode = draft.custom_mask ? MaskMode::kCustom
                : draft.causal    ? MaskMode::kCausal
                                  : MaskMode::kNone;
  if (!draft.o_dtype_given) p.o_dtype = is_fp8(p.q_dtype) ? DType::kBF16 : p.q_dtype;
  if (is_mla(p.op)) {
    Problem derived = p;
    derive_mla_fields(&derived);
    auto fixed = [](const char* key, const auto& given, auto value, auto text) -> Status {
      if (given && *given != value) {
        return Status(ErrorCode::kParseError, std::string(key) + " = " + text(*given) +
                                                  ": batch_mla_paged fixes it to " + text(value) +
                                                  " (give it so, or leave it out)");
      }
      return Status::Ok();
    };
    auto number = [](int n) { return std::to_string(n); };
    auto layout = [](KVLayout l) { return std::string(kv_layout_name(l)); };
    for (Status s : {fixed("num_kv_heads", draft.num_kv_heads, derived.num_kv_heads, number),
                     fixed("head_dim_qk", draft.head_dim_qk, derived.head_dim_qk, number),
                     fixed("head_dim_vo", draft.head_dim_vo, derived.head_dim_vo, number),
                     fixed("kv_layout", draft.kv_layout, derived.kv_layout, layout)}) {
      if (!s.ok()) return s;
    }
    p = derived;
  }
  *out = p;
  return Status::Ok();
}

std::map<std::string, std::string, std::less<>> problem_to_fields(const Problem& problem,
                                                                  const RunValues& run) {
  std::map<std::string, std::string, std::less<>> out;
  for (const ProblemField& f : fields()) {
    if (std::optional<std::string> v = f.get(problem, run)) out.emplace(std::string(f.key), *v);
  }
  return out;
}

std::string format_float(float value) {
  // Fixed notation so that every value reads as a plain decimal; the shortest such string that
  // reads back to the same float. 128 bytes hold the longest (the smallest subnormal).
  char buf[128];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed);
  if (ec != std::errc()) return std::to_string(value);
  return std::string(buf, p);
}

bool parse_int(std::string_view text, int* out) {
  if (text.empty()) return false;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && p == text.data() + text.size();
}

bool parse_int64(std::string_view text, int64_t* out) {
  if (text.empty()) return false;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && p == text.data() + text.size();
}

bool parse_float(std::string_view text, float* out) {
  if (text.empty()) return false;
  if (text.front() == '+') text.remove_prefix(1);
  float v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parse_bool(std::string_view text, bool* out) {
  if (text == "true" || text == "1") {
    *out = true;
    return true;
  }
  if (text == "false" || text == "0") {
    *out = false;
    return true;
  }
  return false;
}

bool parse_length_list(std::string_view text, bool allow_zero, std::vector<int64_t>* out) {
  out->clear();
  while (true) {
    size_t comma = text.find(',');
    int64_t n = 0;
    if (!parse_int64(text.substr(0, comma), &n) || n < 0 || (n == 0 && !allow_zero)) return false;
    out->push_back(n);
    if (comma == std::string_view::npos) return true;
    text.remove_prefix(comma + 1);
  }
}

std::string format_length_list(const std::vector<int64_t>& lengths) {
  std::string s;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(lengths[i]);
  }
  return s;
}

}  // namespace kvattn
