#include "tools/cli_args.h"

#include <algorithm>
#include <limits>

#include "core/status_macros.h"
#include "core/validate.h"
#include "core/validate_variants.h"

namespace kvattn::tools {
namespace {

// Keys per request when neither --kv-len nor a case file says otherwise.
constexpr int64_t kDefaultKvLen = 512;
constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();

Status usage(const std::string& what) { return Status(ErrorCode::kParseError, what); }

const FlagSpec* find_spec(const std::vector<FlagSpec>& specs, std::string_view name) {
  for (const FlagSpec& s : specs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string kebab(std::string_view key) { return flag_for_key(key).substr(2); }

// A length list flag: "N" or "N1,N2,...".
Status read_lengths(const Args& args, std::string_view flag, std::vector<int64_t>* out) {
  const std::string* text = args.get(flag);
  if (!text) return Status::Ok();
  if (!parse_length_list(*text, /*allow_zero=*/true, out)) {
    return usage("--" + std::string(flag) + ": '" + *text +
                 "' is not accepted (expected a length N >= 0 or a comma list N1,N2,... of one "
                 "per request)");
  }
  return Status::Ok();
}

}  // namespace

const std::string* Args::get(std::string_view name) const {
  auto it = values_.find(std::string(name));
  return it == values_.end() ? nullptr : &it->second;
}

Status parse_flags(const std::vector<std::string>& args, size_t first,
                   const std::vector<FlagSpec>& specs, Args* out) {
  for (size_t i = first; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return usage("unexpected argument '" + arg + "' (flags start with --)");
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const FlagSpec* spec = find_spec(specs, name);
    if (!spec) return usage("unknown flag --" + name);
    if (!has_value) {
      if (spec->boolean) {
        value = "true";
      } else {
        // A value may start with '-' (--window-left -1) but not with "--" (the next flag).
        if (i + 1 >= args.size() || args[i + 1].compare(0, 2, "--") == 0) {
          return usage("--" + name + " needs a value (" + spec->value_help + ")");
        }
        value = args[++i];
      }
    }
    if (spec->boolean && value != "true" && value != "false") {
      return usage("--" + name + ": '" + value + "' is not accepted (expected true or false)");
    }
    if (!out->mutable_values()->emplace(name, value).second) {
      return usage("--" + name + " is given twice");
    }
  }
  return Status::Ok();
}

std::string flags_help(const std::vector<FlagSpec>& specs) {
  std::vector<std::string> left;
  size_t width = 0;
  for (const FlagSpec& s : specs) {
    left.push_back("--" + s.name + (s.boolean ? "" : " " + s.value_help));
    width = std::max(width, left.back().size());
  }
  width = std::min<size_t>(width, 34);
  std::string out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out += "  " + left[i];
    if (left[i].size() > width) {
      out += "\n  " + std::string(width, ' ');
    } else {
      out += std::string(width - left[i].size(), ' ');
    }
    out += "  " + specs[i].help + "\n";
  }
  return out;
}

std::vector<FlagSpec> problem_flag_specs() {
  std::vector<FlagSpec> specs;
  for (const ProblemField& f : problem_fields()) {
    specs.push_back({kebab(f.key), f.kind == ProblemField::Kind::kBool, std::string(f.value_help),
                     std::string(f.help)});
  }
  return specs;
}

std::vector<FlagSpec> workload_flag_specs() {
  return {
      {"qo-len", false, "N|N1,N2,..",
       "query tokens per request (prefill; default: the request's kv length)"},
      {"kv-len", false, "N|N1,N2,..", "keys per request (default 512)"},
      {"seed", false, "N", "seed of the random inputs (default 1)"},
  };
}

bool has_problem_flags(const Args& args) {
  for (const FlagSpec& s : problem_flag_specs()) {
    if (args.has(s.name)) return true;
  }
  for (const FlagSpec& s : workload_flag_specs()) {
    if (args.has(s.name)) return true;
  }
  return false;
}

Status problem_from_args(const Args& args, Problem* out, RunValues* run) {
  ProblemDraft draft;
  for (const ProblemField& f : problem_fields()) {
    const std::string flag = kebab(f.key);
    const std::string* value = args.get(flag);
    if (!value) continue;
    std::string why;
    if (!f.set(*value, &draft, &why)) {
      return usage("--" + flag + ": '" + *value + "' is not accepted (" + why + ")");
    }
  }
  Status finished = finish_problem(draft, out);
  if (!finished.ok()) {
    return usage(draft.causal && draft.custom_mask ? "--causal and --custom-mask exclude each other"
                                                   : "--" + finished.message());
  }
  if (!is_batch(out->op) && args.has("batch-size") && out->batch_size != 1) {
    return usage("--batch-size: " + std::to_string(out->batch_size) + " is not accepted (" +
                 std::string(op_name(out->op)) + " runs one request; use a batch_* operation)");
  }
  Status valid = validate_problem(*out);
  if (valid.ok()) valid = validation::check_run_scalars(*out, draft.run.scalars());
  if (!valid.ok()) return usage("invalid problem: " + valid.message());
  if (run) *run = draft.run;
  return Status::Ok();
}

Status workload_from_args(const Args& args, Workload* out) {
  Workload w;
  KVATTN_RETURN_IF_ERROR(problem_from_args(args, &w.problem, &w.run));
  Problem& p = w.problem;
  if (const std::string* seed = args.get("seed")) {
    int64_t value = 0;
    if (!parse_int64(*seed, &value) || value < 0) {
      return usage("--seed: '" + *seed + "' is not accepted (expected an integer >= 0)");
    }
    w.seed = static_cast<uint64_t>(value);
  }
  std::vector<int64_t> qo, kv;
  KVATTN_RETURN_IF_ERROR(read_lengths(args, "qo-len", &qo));
  KVATTN_RETURN_IF_ERROR(read_lengths(args, "kv-len", &kv));
  if (is_decode(p.op) && std::any_of(qo.begin(), qo.end(), [](int64_t l) { return l != 1; })) {
    return usage("--qo-len: '" + *args.get("qo-len") + "' is not accepted (" +
                 std::string(op_name(p.op)) + " has one query per request)");
  }
  // A list longer than one sets the batch size; --batch-size, when given, must agree.
  const bool batch_given = args.has("batch-size");
  for (auto [flag, list] : {std::pair{"qo-len", &qo}, std::pair{"kv-len", &kv}}) {
    if (list->size() <= 1) continue;
    if (!is_batch(p.op)) {
      return usage(std::string("--") + flag + ": " + std::to_string(list->size()) +
                   " lengths given, but " + std::string(op_name(p.op)) + " runs one request");
    }
    if (batch_given && static_cast<int64_t>(list->size()) != p.batch_size) {
      return usage(std::string("--") + flag + ": " + std::to_string(list->size()) +
                   " lengths given for --batch-size " + std::to_string(p.batch_size));
    }
    if (!batch_given && list->size() != static_cast<size_t>(p.batch_size) && p.batch_size != 1) {
      return usage(std::string("--") + flag + ": " + std::to_string(list->size()) +
                   " lengths for batch size " + std::to_string(p.batch_size));
    }
    p.batch_size = static_cast<int>(list->size());
  }
  if (qo.size() > 1 && kv.size() > 1 && qo.size() != kv.size()) {
    return usage("--qo-len and --kv-len give different numbers of requests (" +
                 std::to_string(qo.size()) + " and " + std::to_string(kv.size()) + ")");
  }
  const auto batch = static_cast<size_t>(p.batch_size);
  if (kv.empty()) kv.assign(1, kDefaultKvLen);
  if (kv.size() == 1) kv.assign(batch, kv[0]);
  if (is_decode(p.op) || (is_mla(p.op) && qo.empty())) {
    // MLA without --qo-len is decode (one query per request); prefill gives --qo-len.
    qo.assign(batch, 1);
  } else if (qo.empty()) {
    qo = kv;
  } else if (qo.size() == 1) {
    qo.assign(batch, qo[0]);
  }
  if (p.op == Op::kSinglePrefill && qo[0] == 0) {
    return usage("--qo-len: single_prefill needs at least one query token");
  }
  // Index tensors are int32: every token count, and the totals, must fit.
  for (auto [flag, list] : {std::pair{"qo-len", &qo}, std::pair{"kv-len", &kv}}) {
    int64_t total = 0;
    for (int64_t l : *list) total += std::min<int64_t>(l, kMaxTokens + 1);
    if (total > kMaxTokens) {
      return usage(std::string("--") + flag + ": " + std::to_string(total) +
                   " tokens in all is more than the int32 index tensors hold (" +
                   std::to_string(kMaxTokens) + ")");
    }
  }
  w.qo_lens = std::move(qo);
  w.kv_lens = std::move(kv);
  *out = std::move(w);
  return Status::Ok();
}

Status device_from_args(const Args& args, Device* out) {
  const std::string* text = args.get("device");
  if (!text) {
    *out = Device::cpu();
    return Status::Ok();
  }
  std::string error;
  std::optional<Device> d = Device::parse(*text, &error);
  if (d) {
    *out = *d;
    return Status::Ok();
  }
  // A GPU asked for by ordinal that this machine lacks is unavailable, not a usage error.
  const bool gpu_ordinal = text->rfind("cuda", 0) == 0 && text->find("sm") == std::string::npos;
  return Status(gpu_ordinal ? ErrorCode::kUnavailable : ErrorCode::kParseError,
                "--device: " + error);
}

int exit_code_for(const Status& s) {
  switch (s.code()) {
    case ErrorCode::kOk:
      return kExitOk;
    case ErrorCode::kNotSupported:
    case ErrorCode::kUnavailable:
      return kExitUnsupported;
    default:
      return kExitFailure;
  }
}

}  // namespace kvattn::tools
