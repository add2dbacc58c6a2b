// Command-line flags: "--name value", "--name=value", and boolean "--name" (or --name=false).
// Every flag is declared; an unknown, repeated or valueless flag is a usage error, never ignored.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/device.h"
#include "kvattn/status.h"
#include "kvattn/problem_text.h"

namespace kvattn::tools {

// Exit codes of the kvattn command (documented in `kvattn --help`).
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,      // a failed --check, or a runtime / file error
  kExitUsage = 2,        // bad command line: unknown flag, bad value, invalid problem
  kExitUnsupported = 3,  // no backend can run it here, or the requested one cannot / is absent
};

struct FlagSpec {
  std::string name;  // without the leading "--"
  bool boolean = false;
  std::string value_help;  // "N", "FILE", "f32|f16|bf16|e4m3|e5m2"
  std::string help;
};

class Args {
 public:
  bool has(std::string_view name) const { return values_.count(std::string(name)) > 0; }
  // The value given (a bare boolean flag reads "true"), or null.
  const std::string* get(std::string_view name) const;
  const std::map<std::string, std::string>& values() const { return values_; }
  std::map<std::string, std::string>* mutable_values() { return &values_; }

 private:
  std::map<std::string, std::string> values_;
};

// Parses args[first...]. kParseError naming the flag otherwise.
Status parse_flags(const std::vector<std::string>& args, size_t first,
                   const std::vector<FlagSpec>& specs, Args* out);
// "  --name VALUE   help" lines, aligned.
std::string flags_help(const std::vector<FlagSpec>& specs);

// The problem flags (FlashInfer's names in kebab case) and the workload flags (--qo-len,
// --kv-len, --seed).
std::vector<FlagSpec> problem_flag_specs();
std::vector<FlagSpec> workload_flag_specs();

// What to run: the problem, the per-request lengths and the seed of the random inputs.
struct Workload {
  Problem problem;
  RunValues run;  // --q-scale, --k-scale, --v-scale, --return-lse
  std::vector<int64_t> qo_lens, kv_lens;
  uint64_t seed = 1;
};

// The problem (and the per-layer run values, when `run` is given) from its flags; validated.
// kParseError naming the flag, the value and what is accepted, or the rule the problem breaks.
Status problem_from_args(const Args& args, Problem* out, RunValues* run = nullptr);
// The problem and the lengths; kParseError likewise.
Status workload_from_args(const Args& args, Workload* out);
// True when any problem or workload flag is given.
bool has_problem_flags(const Args& args);

// The device of --device (default: this machine's CPU). kParseError for a malformed one,
// kUnavailable for a GPU ordinal (cuda, cuda:N) this machine does not have.
Status device_from_args(const Args& args, Device* out);

// The exit code for a Status from selection, planning or running.
int exit_code_for(const Status& s);

}  // namespace kvattn::tools
