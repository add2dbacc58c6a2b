// kvattn run: one attention problem on random (seeded) or replayed inputs, timed, optionally
// checked against the reference, its inputs and outputs optionally saved.
#include <algorithm>
#include <exception>
#include <iomanip>
#include <iostream>

#include "kvattn/attention.h"
#include "kvattn/selection.h"
#include "testing/case_builder.h"
#include "tools/case_file.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/run_check.h"
#include "tools/timed_run.h"

namespace kvattn::tools {
namespace {

constexpr int kDefaultRepeat = 5;

std::vector<FlagSpec> run_flags() {
  std::vector<FlagSpec> specs = problem_flag_specs();
  for (FlagSpec& s : workload_flag_specs()) specs.push_back(std::move(s));
  specs.push_back({"case", false, "FILE", "replay a case file instead of random inputs"});
  specs.push_back({"backend", false, "auto|reference|cpu|fa2|fa3", "backend (default auto)"});
  specs.push_back({"device", false, "cpu|cpu:ISA|cuda:N", "device (default cpu)"});
  specs.push_back({"threads", false, "N", "CPU threads (default 0: all cores)"});
  specs.push_back({"repeat", false, "N", "timed runs after one warm-up (default 5)"});
  specs.push_back(
      {"check", true, "", "compare with the fp64 reference (exit 1 if out of tolerance)"});
  specs.push_back({"output", false, "FILE", "write out (and lse) to a .safetensors file"});
  specs.push_back({"save-case", false, "FILE", "write the inputs and problem as a case file"});
  specs.push_back({"help", true, "", "this help"});
  return specs;
}

void print_help() {
  std::cout
      << "usage: kvattn run [problem flags | --case FILE] [--backend auto|reference|cpu|fa2|fa3]\n"
         "                  [--output FILE] [--check] [--save-case FILE] [--device ...]\n"
         "                  [--threads N] [--repeat N]\n\n"
         "Runs one attention call on random inputs (seeded, uniform in [-1, 1], quantized to the\n"
         "dtypes; pages shuffled) or on a case file's, and prints the backend, the median time,\n"
         "the achieved GB/s (q, k, v, o, lse bytes) and GFLOP/s (DESIGN.md §5). --check compares\n"
         "with the fp64 reference: max |err| <= 2 x the error of a plain low-precision\n"
         "implementation + atol. On a GPU (--device cuda:N) the data tensors are copied to its\n"
         "memory (index tensors stay on the host) and each timed call includes a synchronize.\n"
         "Exit: 0 ok, 1 check failed or runtime/file error, 2 usage error, 3 not supported or\n"
         "unavailable.\n\nflags:\n"
      << flags_help(run_flags());
}

bool flag_true(const Args& a, std::string_view name) {
  const std::string* v = a.get(name);
  return v && *v == "true";
}

Status int_flag(const Args& a, std::string_view name, int min_value, int* out) {
  const std::string* v = a.get(name);
  if (!v) return Status::Ok();
  if (!parse_int(*v, out) || *out < min_value) {
    return Status(ErrorCode::kParseError, "--" + std::string(name) + ": '" + *v +
                                              "' is not accepted (expected an integer >= " +
                                              std::to_string(min_value) + ")");
  }
  return Status::Ok();
}

Status random_case(const Workload& w, io::OwnedCase* out) {
  testing::CaseSpec spec;
  spec.problem = w.problem;
  spec.scalars = w.run.scalars();
  spec.return_lse = w.run.return_lse;
  spec.qo_lens = w.qo_lens;
  spec.kv_lens = w.kv_lens;
  spec.seed = w.seed;
  try {
    testing::Case c = testing::Case::make(spec);
    return io::capture_case(c, out);
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInvalidArgument, std::string("cannot build the inputs: ") + e.what());
  }
}

std::string summarize_lengths(const std::vector<int64_t>& lens) {
  if (lens.empty()) return "[]";
  if (std::all_of(lens.begin(), lens.end(), [&](int64_t l) { return l == lens[0]; })) {
    return std::to_string(lens[0]) + (lens.size() > 1 ? " x " + std::to_string(lens.size()) : "");
  }
  std::string s = "[";
  for (size_t i = 0; i < lens.size() && i < 16; ++i) {
    if (i) s += ',';
    s += std::to_string(lens[i]);
  }
  return s + (lens.size() > 16 ? ",...]" : "]");
}

int fail(const Status& s, const char* what) {
  std::cerr << "kvattn run: " << what << ": " << s.to_string() << '\n';
  return exit_code_for(s);
}

}  // namespace

int run_main(const std::vector<std::string>& args) {
  Args flags;
  Status s = parse_flags(args, 1, run_flags(), &flags);
  if (s.ok() && flag_true(flags, "help")) {
    print_help();
    return kExitOk;
  }
  int threads = 0, repeat = kDefaultRepeat;
  if (s.ok()) s = int_flag(flags, "threads", 0, &threads);
  if (s.ok()) s = int_flag(flags, "repeat", 1, &repeat);
  PlanOptions options;
  options.num_threads = threads;
  if (s.ok() && flags.get("backend")) {
    options.backend = *flags.get("backend");
    std::vector<std::string> names = backend_names();
    if (options.backend != "auto" &&
        std::find(names.begin(), names.end(), options.backend) == names.end()) {
      s = Status(ErrorCode::kParseError, "--backend: '" + options.backend +
                                             "' is not accepted (expected auto, reference, cpu, "
                                             "fa2 or fa3)");
    }
  }
  if (s.ok()) s = device_from_args(flags, &options.device);
  if (s.ok() && flags.has("case") && has_problem_flags(flags)) {
    s = Status(ErrorCode::kParseError,
               "--case replays a file's problem; problem flags cannot be given with it");
  }
  Workload w;
  if (s.ok() && !flags.has("case")) s = workload_from_args(flags, &w);
  if (s.code() == ErrorCode::kUnavailable) return fail(s, "cannot run");
  if (!s.ok()) {
    std::cerr << "kvattn run: " << s.message() << "\n(see kvattn run --help)\n";
    return kExitUsage;
  }

  io::OwnedCase c;
  s = flags.has("case") ? io::load_case(*flags.get("case"), &c) : random_case(w, &c);
  if (!s.ok()) return fail(s, flags.has("case") ? "cannot load the case" : "cannot make inputs");
  const Problem& p = c.problem;
  if (const std::string* path = flags.get("save-case")) {
    // Saved before running, so that a case that crashes a backend is kept.
    s = io::save_case(*path, c);
    if (!s.ok()) return fail(s, "cannot save the case");
  }
  if (options.device.is_cuda()) {
    // Selection first, so that a backend that cannot run the problem says so (and which would)
    // before anything is copied to a GPU.
    std::string selected;
    s = select_backend(p, options.device, options.backend, &selected);
    if (!s.ok()) return fail(s, "cannot run");
  }
  io::OutputBuffers outputs;
  TimedRun timed;
  s = options.device.is_cuda() ? timed_run_cuda(c, options, repeat, &outputs, &timed)
                               : timed_run_host(c, options, repeat, &outputs, &timed);
  if (!s.ok()) return fail(s, "cannot run");
  const Plan& plan = timed.plan;
  const double median = timed.median();

  std::cout << "problem: " << p.to_string() << '\n'
            << "lengths: qo " << summarize_lengths(c.qo_lens) << ", kv "
            << summarize_lengths(c.kv_lens) << '\n'
            << "backend: " << plan.backend << " on " << plan.device.to_string() << ", "
            << plan.num_threads << " threads\n";
  if (!plan.kernel.empty()) std::cout << "kernel: " << plan.kernel << '\n';
  std::cout << std::fixed << std::setprecision(3) << "time: " << median * 1e3 << " ms median of "
            << repeat << " (min " << timed.seconds.front() * 1e3 << ")\n"
            << std::setprecision(2) << "throughput: " << c.bytes_moved() / median / 1e9 << " GB/s, "
            << c.flops() / median / 1e9 << " GFLOP/s\n";
  int code = kExitOk;
  if (flag_true(flags, "check")) {
    testing::CheckResult result;
    s = check_against_reference(c, outputs, &result);
    if (!s.ok()) return fail(s, "check could not run");
    std::cout << "check: " << (result.ok ? "PASS" : "FAIL") << ": " << result.message << '\n';
    if (!result.ok) code = kExitFailure;
  }
  if (const std::string* path = flags.get("output")) {
    std::vector<int64_t> shape = c.out_shape();
    TensorView out = TensorView::contiguous(outputs.out.data(), p.o_dtype, shape.data(),
                                            static_cast<int>(shape.size()));
    TensorView lse;
    if (c.run.return_lse) {
      lse = TensorView::contiguous(outputs.lse.data(), DType::kF32, shape.data(),
                                   static_cast<int>(shape.size()) - 1);
    }
    s = io::save_output(*path, p, c.run, out, lse,
                        {{"backend", plan.backend}, {"device", plan.device.to_string()}});
    if (!s.ok()) return fail(s, "cannot write the output");
  }
  return code;
}

}  // namespace kvattn::tools
