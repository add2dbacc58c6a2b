// Loading a case file: metadata -> Problem, tensors checked against it, then the request lengths.
#include <algorithm>
#include <cstring>
#include <set>
#include <span>

#include "core/status_macros.h"
#include "core/validate.h"
#include "kvattn/problem_text.h"
#include "tools/case_file.h"
#include "tools/case_tensors.h"
#include "tools/safetensors.h"

namespace kvattn::io {
namespace {

// Metadata that is not a problem parameter: written for people reading the file, checked when
// present.
constexpr std::string_view kInformationalKeys[] = {"qo_len", "kv_len", "seed"};
constexpr std::string_view kRequiredKeys[] = {"op",          "num_qo_heads", "num_kv_heads",
                                              "head_dim_qk", "head_dim_vo",  "q_data_type",
                                              "kv_data_type"};
// MLA's own: the keys it fixes (num_kv_heads, head_dim_qk, head_dim_vo, kv_layout) may be absent.
constexpr std::string_view kRequiredMlaKeys[] = {"op",           "num_qo_heads", "head_dim_ckv",
                                                 "head_dim_kpe", "page_size",    "q_data_type",
                                                 "kv_data_type", "sm_scale"};

Status parse_error(const std::string& what) {
  return Status(ErrorCode::kParseError, "case file: " + what);
}

// The tensors of the variants: sinks, per-head and per-(token, head) K/V scales.
std::vector<std::string_view> variant_tensors(const Problem& p) {
  std::vector<std::string_view> names;
  if (p.use_sinks) names.push_back("sinks");
  if (p.kv_scale_granularity == KVScaleGranularity::kPerHead) {
    names.insert(names.end(), {"k_scale", "v_scale"});
  }
  if (p.kv_scale_granularity == KVScaleGranularity::kPerTokenHead) {
    names.insert(names.end(), {"k_scale_cache", "v_scale_cache"});
  }
  return names;
}

std::vector<std::string_view> required_tensors(Op op) {
  switch (op) {
    case Op::kSingleDecode:
    case Op::kSinglePrefill:
      return {"q", "k", "v"};
    case Op::kBatchDecode:
      return {"q", "paged_k_cache", "paged_v_cache", "kv_indptr", "kv_indices", "kv_last_page_len"};
    case Op::kBatchPrefillPaged:
      return {"q",         "qo_indptr",  "paged_k_cache",   "paged_v_cache",
              "kv_indptr", "kv_indices", "kv_last_page_len"};
    case Op::kBatchPrefillRagged:
      return {"q", "qo_indptr", "k", "v", "kv_indptr"};
    case Op::kBatchMLAPaged:
      return {"q_nope",    "q_pe",      "qo_indptr",  "ckv_cache",
              "kpe_cache", "kv_indptr", "kv_indices", "kv_last_page_len"};
  }
  return {};
}

// The expected shape of a tensor for `p`; -1 where a length decides (checked with the lengths).
std::vector<int64_t> expected_shape(const Problem& p, std::string_view name) {
  const int64_t hq = p.num_qo_heads, hk = p.num_kv_heads, dqk = p.head_dim_qk, dvo = p.head_dim_vo,
                ps = p.page_size;
  const bool nhd = p.kv_layout == KVLayout::kNHD;
  if (name == "q_nope") return {-1, hq, p.head_dim_ckv};
  if (name == "q_pe") return {-1, hq, p.head_dim_kpe};
  if (name == "ckv_cache") return {-1, ps, p.head_dim_ckv};
  if (name == "kpe_cache") return {-1, ps, p.head_dim_kpe};
  if (name == "q") {
    if (p.op == Op::kSingleDecode) return {hq, dqk};
    return {-1, hq, dqk};
  }
  if (name == "k" || name == "v") {
    int64_t d = name == "k" ? dqk : dvo;
    // Ragged KV is always NHD, as in FlashInfer.
    if (nhd || p.op == Op::kBatchPrefillRagged) return {-1, hk, d};
    return {hk, -1, d};
  }
  if (name == "paged_k_cache" || name == "paged_v_cache") {
    int64_t d = name == "paged_k_cache" ? dqk : dvo;
    if (nhd) return {-1, ps, hk, d};
    return {-1, hk, ps, d};
  }
  if (name == "alibi_slopes" || name == "sinks") return {hq};
  if (name == "k_scale" || name == "v_scale") return {hk};
  if (name == "k_scale_cache" || name == "v_scale_cache") {
    // Addressed like the slot each scales: [num_pages, page_size, H_kv] beside a paged cache.
    if (is_paged(p.op)) return {-1, ps, hk};
    return {-1, hk};
  }
  return {-1};  // index tensors and the custom mask: sizes follow from the lengths
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? std::string("*") : std::to_string(shape[i]);
  }
  return s + "]";
}

Status read_metadata(const SafeTensors& st, ProblemDraft* draft, bool* custom_mask_given,
                     bool* batch_size_given) {
  auto op = st.metadata.find(std::string_view("op"));
  const bool mla = op != st.metadata.end() && parse_op(op->second) == Op::kBatchMLAPaged;
  for (std::string_view key : mla ? std::span<const std::string_view>(kRequiredMlaKeys)
                                  : std::span<const std::string_view>(kRequiredKeys)) {
    if (!st.metadata.count(key)) {
      return parse_error("__metadata__ lacks \"" + std::string(key) + "\"");
    }
  }
  for (const auto& [key, value] : st.metadata) {
    if (std::find(std::begin(kInformationalKeys), std::end(kInformationalKeys), key) !=
        std::end(kInformationalKeys)) {
      continue;
    }
    const ProblemField* field = find_problem_field(key);
    if (!field) {
      return parse_error("__metadata__ key \"" + key +
                         "\" is not a problem parameter (keys are FlashInfer's snake_case names, "
                         "see docs/case-files.md)");
    }
    std::string why;
    if (!field->set(value, draft, &why)) {
      return parse_error("__metadata__ " + key + " = \"" + value + "\": " + why);
    }
    if (key == "custom_mask") *custom_mask_given = true;
    if (key == "batch_size") *batch_size_given = true;
  }
  return Status::Ok();
}

Status check_informational(const SafeTensors& st, const OwnedCase& c) {
  for (auto [key, lengths] : {std::pair{"qo_len", &c.qo_lens}, std::pair{"kv_len", &c.kv_lens}}) {
    auto it = st.metadata.find(std::string_view(key));
    if (it == st.metadata.end()) continue;
    if (it->second != format_length_list(*lengths)) {
      return parse_error(std::string("__metadata__ ") + key + " = \"" + it->second +
                         "\" but the tensors give " + format_length_list(*lengths));
    }
  }
  auto seed = st.metadata.find(std::string_view("seed"));
  if (seed != st.metadata.end()) {
    int64_t value = 0;
    if (!parse_int64(seed->second, &value)) {
      return parse_error("__metadata__ seed = \"" + seed->second + "\": expected an integer");
    }
  }
  return Status::Ok();
}

Status case_from_safetensors(const SafeTensors& st, OwnedCase* out) {
  ProblemDraft draft;
  bool custom_mask_given = false, batch_size_given = false;
  KVATTN_RETURN_IF_ERROR(read_metadata(st, &draft, &custom_mask_given, &batch_size_given));
  const bool has_mask_tensor = st.find("custom_mask") != nullptr;
  if (custom_mask_given && draft.custom_mask != has_mask_tensor) {
    return parse_error(
        draft.custom_mask
            ? "__metadata__ custom_mask = \"true\" but there is no custom_mask tensor"
            : "a custom_mask tensor is given but __metadata__ custom_mask = \"false\"");
  }
  draft.custom_mask = has_mask_tensor;
  Problem p;
  Status finished = finish_problem(draft, &p);
  if (!finished.ok()) return parse_error(finished.message());

  // Tensor names and ranks first: the batch size may have to be read from a shape.
  std::vector<std::string_view> required = required_tensors(p.op);
  for (std::string_view name : variant_tensors(p)) required.push_back(name);
  for (std::string_view name : required) {
    if (!st.find(name)) {
      return parse_error("tensor \"" + std::string(name) + "\" is missing (" +
                         std::string(op_name(p.op)) + " needs it)");
    }
  }
  for (const auto& [name, t] : st.tensors) {
    bool allowed = std::find(required.begin(), required.end(), name) != required.end() ||
                   (name == "custom_mask" && p.mask_mode == MaskMode::kCustom) ||
                   (name == "alibi_slopes" && p.pos_encoding_mode == PosEncoding::kAlibi);
    if (!allowed) {
      return parse_error("tensor \"" + name + "\" is not an input of " +
                         std::string(op_name(p.op)) + " with this problem's parameters");
    }
    if (t.shape.size() != expected_shape(p, name).size()) {
      return parse_error("tensor \"" + name + "\" has rank " + std::to_string(t.shape.size()) +
                         ", expected shape " + shape_text(expected_shape(p, name)));
    }
  }
  if (is_batch(p.op) && !batch_size_given) {
    p.batch_size = p.op == Op::kBatchDecode
                       ? static_cast<int>(std::min<int64_t>(st.find("q")->shape[0], 1 << 30))
                       : static_cast<int>(std::max<int64_t>(
                             0, std::min<int64_t>(st.find("qo_indptr")->shape[0] - 1, 1 << 30)));
  }
  Status valid = validate_problem(p);
  if (!valid.ok()) return parse_error("problem: " + valid.message());

  OwnedCase c;
  c.problem = p;
  c.run = draft.run;
  for (const auto& [name, t] : st.tensors) {
    DType dtype = detail::case_input_dtype(p, name);
    if (t.dtype != dtype) {
      return parse_error("tensor \"" + name + "\" has dtype " +
                         std::string(safetensors_dtype_name(t.dtype)) + ", expected " +
                         std::string(safetensors_dtype_name(dtype)) + " for this problem");
    }
    std::vector<int64_t> expected = expected_shape(p, name);
    for (size_t d = 0; d < expected.size(); ++d) {
      if (expected[d] >= 0 && t.shape[d] != expected[d]) {
        return parse_error("tensor \"" + name + "\" has shape " + shape_text(t.shape) +
                           ", expected " + shape_text(expected));
      }
    }
    c.inputs.emplace(name,
                     std::vector<std::byte>(
                         reinterpret_cast<const std::byte*>(t.bytes.data()),
                         reinterpret_cast<const std::byte*>(t.bytes.data()) + t.bytes.size()));
    c.input_shapes.emplace(name, t.shape);
  }
  Status lengths = detail::case_request_lengths(p, c.inputs_view(), &c.qo_lens, &c.kv_lens);
  if (!lengths.ok()) return parse_error(lengths.message());
  if (p.mask_mode == MaskMode::kCustom) {
    int64_t bits = 0;
    bool overflow = false;
    for (size_t b = 0; b < c.qo_lens.size(); ++b) {
      int64_t request_bits = 0;
      overflow |= __builtin_mul_overflow(c.qo_lens[b], c.kv_lens[b], &request_bits);
      overflow |= __builtin_add_overflow(bits, request_bits, &bits);
    }
    if (overflow || c.input_shapes.at("custom_mask")[0] != bits) {
      return parse_error("tensor \"custom_mask\" has " +
                         std::to_string(c.input_shapes.at("custom_mask")[0]) +
                         " elements, the requests' qo_len x kv_len need " + std::to_string(bits));
    }
  }
  KVATTN_RETURN_IF_ERROR(check_informational(st, c));
  auto seed = st.metadata.find(std::string_view("seed"));
  if (seed != st.metadata.end()) c.extra_metadata["seed"] = seed->second;
  *out = std::move(c);
  return Status::Ok();
}

}  // namespace

Status parse_case(const uint8_t* data, size_t size, OwnedCase* out) {
  SafeTensors st;
  KVATTN_RETURN_IF_ERROR(parse_safetensors(data, size, &st));
  return case_from_safetensors(st, out);
}

Status load_case(const std::string& path, OwnedCase* out) {
  SafeTensorsFile file;
  KVATTN_RETURN_IF_ERROR(read_safetensors_file(path, &file));
  Status s = case_from_safetensors(file.contents, out);
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  return Status::Ok();
}

}  // namespace kvattn::io
