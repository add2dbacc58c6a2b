// The problem parameters as text, under FlashInfer's names: one table shared by the command-line
// flags (kebab case: --num-qo-heads), the case-file metadata (snake case: num_qo_heads) and the
// Python extension (keyword names), so that a parameter is spelled one way everywhere and one
// table says how each is parsed, printed and refused (the refusal message names the key, the
// value and what is accepted).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/attention.h"
#include "kvattn/problem.h"
#include "kvattn/status.h"

namespace kvattn {

// The per-layer values the command line and the case files carry beside the problem under the
// same table (--q-scale, --return-lse; metadata q_scale, return_lse): at run they are
// AttentionArgs::scalars and whether an lse tensor is given, never fields of the Problem.
struct RunValues {
  float q_scale = 1.0f, k_scale = 1.0f, v_scale = 1.0f;
  bool return_lse = false;
  RunScalars scalars() const;  // the scales (LSE base e)
};

// A problem being assembled field by field. The mask kind and the default o dtype are resolved
// by finish_problem once every field is known (o dtype follows q: fp8 q -> bf16).
struct ProblemDraft {
  Problem problem;
  RunValues run;
  bool causal = false;
  bool custom_mask = false;
  bool o_dtype_given = false;
  // Fields batch_mla_paged fixes (num_kv_heads 1, head_dim_qk D_ckv + D_kpe, head_dim_vo D_ckv,
  // kv_layout NHD): set only when given, so that finish_problem can hold a given one to its value.
  std::optional<int> num_kv_heads, head_dim_qk, head_dim_vo;
  std::optional<KVLayout> kv_layout;
};

struct ProblemField {
  // What a value is: kBool is a flag without a value on the command line (--causal) and
  // "true"/"false" in metadata; the others take a value. Python reads and writes each kind as
  // its own type (bool, int, float, str).
  enum class Kind { kBool, kInt, kFloat, kText };

  std::string_view key;  // snake_case metadata key; the flag is "--" + kebab case
  Kind kind = Kind::kText;
  std::string_view value_help;  // what is accepted, e.g. "f32|f16|bf16|e4m3|e5m2"
  std::string_view help;
  // Parses `value` into the draft; on failure `why` says what is accepted.
  bool (*set)(std::string_view value, ProblemDraft* draft, std::string* why);
  // The value as written on the command line, or nullopt when the parameter is unset (sm_scale).
  std::optional<std::string> (*get)(const Problem& problem, const RunValues& run);
  // A per-layer run value (RunValues), not a field of the Problem.
  bool run_value = false;
};

std::span<const ProblemField> problem_fields();
const ProblemField* find_problem_field(std::string_view key);
// "num_qo_heads" -> "--num-qo-heads".
std::string flag_for_key(std::string_view key);

// Resolves the mask kind and the default o dtype, and for batch_mla_paged the fields it fixes.
// kParseError when --causal and --custom-mask are both given, or when a field MLA fixes is given
// with another value (the message names the key).
Status finish_problem(const ProblemDraft& draft, Problem* out);

// Every parameter of `problem` (and the run values) under its key, values as on the command line.
std::map<std::string, std::string, std::less<>> problem_to_fields(const Problem& problem,
                                                                  const RunValues& run = {});

// Number formatting and parsing as the command line and the case files use them: integers in
// decimal, floats as the shortest decimal that reads back to the same float.
std::string format_float(float value);
bool parse_int(std::string_view text, int* out);
bool parse_int64(std::string_view text, int64_t* out);
bool parse_float(std::string_view text, float* out);
bool parse_bool(std::string_view text, bool* out);
// "1,2,3" -> {1, 2, 3}; each > 0 unless allow_zero.
bool parse_length_list(std::string_view text, bool allow_zero, std::vector<int64_t>* out);
std::string format_length_list(const std::vector<int64_t>& lengths);

}  // namespace kvattn
