// libFuzzer target: bytes -> the .safetensors reader and the case-file loader built on it. Any
// input must give OK or kParseError (never a crash, a hang, or a read outside the bytes); a case
// that loads must then pass through validation and, when valid and small, run on the reference.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/validate.h"
#include "kvattn/attention.h"
#include "tools/case_file.h"
#include "tools/safetensors.h"

namespace {

// Above this many score products the reference is not run (the fp64 reference is slow and a
// file of a few KiB can describe a large problem through stride-free shapes).
constexpr double kMaxReferenceWork = 2e5;

[[noreturn]] void finding(const char* what, const kvattn::Status& s) {
  std::fprintf(stderr, "FINDING: %s: %s\n", what, s.to_string().c_str());
  std::abort();
}

void check_kind(const char* what, const kvattn::Status& s) {
  if (!s.ok() && s.code() != kvattn::ErrorCode::kParseError) finding(what, s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvattn;
  io::SafeTensors tensors;
  check_kind("parse_safetensors: not a parse error", io::parse_safetensors(data, size, &tensors));

  io::OwnedCase c;
  const Status loaded = io::parse_case(data, size, &c);
  check_kind("parse_case: not a parse error", loaded);
  if (!loaded.ok()) return 0;

  io::OutputBuffers buffers;
  const AttentionArgs args = c.args_with_outputs(&buffers, c.problem.o_dtype, c.run.return_lse);
  if (!validate_attention(c.problem, args).ok()) return 0;
  double work = 0;
  for (size_t b = 0; b < c.qo_lens.size() && b < c.kv_lens.size(); ++b) {
    work += static_cast<double>(c.qo_lens[b]) * static_cast<double>(c.kv_lens[b]);
  }
  work *=
      static_cast<double>(c.problem.num_qo_heads) * (c.problem.head_dim_qk + c.problem.head_dim_vo);
  if (work > kMaxReferenceWork) return 0;
  PlanOptions options;
  options.backend = "reference";
  const Status ran = kvattn::run(c.problem, args, options);
  if (!ran.ok()) finding("reference failed on a loaded, validated case", ran);
  return 0;
}
