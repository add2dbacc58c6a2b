// kvattn explain: which backend `auto` picks for a problem on a device, and every verdict.
#include <iostream>

#include "kvattn/selection.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace kvattn::tools {
namespace {

std::vector<FlagSpec> explain_flags() {
  std::vector<FlagSpec> specs = problem_flag_specs();
  for (FlagSpec& s : workload_flag_specs()) specs.push_back(std::move(s));
  specs.push_back({"device", false, "cpu|cpu:ISA|cuda:smNN",
                   "the device to select for (default cpu); a described GPU need not be here"});
  specs.push_back({"json", true, "", "print the explanation as JSON"});
  specs.push_back({"help", true, "", "this help"});
  return specs;
}

void print_help() {
  std::cout
      << "usage: kvattn explain [problem flags] [--device cpu|cuda:smNN] [--json]\n\n"
         "Asks every backend whether it can implement the problem on the device and prints\n"
         "the backend `auto` selects and every verdict (supported, reason, available).\n"
         "For a described device this machine does not have, `selected` is what a build\n"
         "with every backend would pick; availability is reported beside each verdict.\n"
         "JSON: {\"device\": ..., \"selected\": \"<name>\" or null, \"verdicts\": [{\"backend\","
         " \"supported\", \"reason\", \"available\", \"availability\"}]}; the cpu verdict\n"
         "also has \"cpu_kernel\": the CPU kernel its plan would run (KVATTN_CPU_KERNEL=<name>|\n"
         "reference overrides the choice; null, with \"cpu_kernel_error\", where it cannot)\n"
         "and \"cpu_kernel_taller\": the prefill kernels of taller query tiles its plan takes\n"
         "instead where the requests' lengths allow (enough work items for the threads), and\n"
         "\"cpu_kernel_one_token\": the decode kernel a batch_prefill_paged plan runs where\n"
         "every request has one query token (null for the other ops).\n"
         "Exit: 0 a backend is selected, 3 none can run it, 2 usage error.\n\nflags:\n"
      << flags_help(explain_flags());
}

}  // namespace

int explain_main(const std::vector<std::string>& args) {
  const std::vector<FlagSpec> specs = explain_flags();
  Args flags;
  Status parsed = parse_flags(args, 1, specs, &flags);
  if (!parsed.ok()) {
    std::cerr << "kvattn explain: " << parsed.message() << "\n(see kvattn explain --help)\n";
    return kExitUsage;
  }
  if (flags.has("help") && *flags.get("help") == "true") {
    print_help();
    return kExitOk;
  }
  Workload w;
  Status s = workload_from_args(flags, &w);
  if (!s.ok()) {
    std::cerr << "kvattn explain: " << s.message() << '\n';
    return kExitUsage;
  }
  Device device;
  s = device_from_args(flags, &device);
  if (!s.ok()) {
    std::cerr << "kvattn explain: " << s.message() << '\n';
    return s.code() == ErrorCode::kUnavailable ? kExitUnsupported : kExitUsage;
  }
  Explanation e = explain(w.problem, device);
  if (flags.has("json") && *flags.get("json") == "true") {
    std::cout << e.to_json() << '\n';
  } else {
    std::cout << "problem: " << w.problem.to_string() << '\n' << e.to_text();
  }
  return e.selected ? kExitOk : kExitUnsupported;
}

}  // namespace kvattn::tools
