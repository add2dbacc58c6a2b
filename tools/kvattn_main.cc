// The kvattn command line: explain, run, devices, bench.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "kvattn/version.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace {

constexpr const char* kHelp =
    "usage: kvattn <command> [flags]\n"
    "\n"
    "commands:\n"
    "  explain   which backend `auto` selects for a problem on a device, and every backend's\n"
    "            verdict (--json for machine-readable output)\n"
    "  run       run a problem on random or replayed (--case FILE) inputs: time, GB/s, GFLOP/s,\n"
    "            --check against the fp64 reference, --output / --save-case files\n"
    "  devices   this machine's CPU (ISA, features, threads) and CUDA devices\n"
    "  bench     the benchmark harness (when built)\n"
    "\n"
    "`kvattn <command> --help` lists a command's flags. Problem flags are FlashInfer's names in\n"
    "kebab case (--op, --num-qo-heads, --q-data-type, ...); case files are described in\n"
    "docs/case-files.md.\n"
    "\n"
    "exit codes:\n"
    "  0  success\n"
    "  1  a failed --check, or a runtime or file error\n"
    "  2  usage error: unknown flag, bad value (the message names the flag, the value and what\n"
    "     is accepted), invalid problem\n"
    "  3  not supported or unavailable: no backend can run the problem on the device, the\n"
    "     requested backend cannot (never a silent fallback), or it is not built / not here\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace kvattn::tools;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kHelp;
    return kExitUsage;
  }
  const std::string& command = args[0];
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kHelp;
    return kExitOk;
  }
  if (command == "--version") {
    std::cout << "kvattn " << kvattn::version_string() << '\n';
    return kExitOk;
  }
  if (command == "explain") return explain_main(args);
  if (command == "run") return run_main(args);
  if (command == "devices") return devices_main(args);
  if (command == "bench") return bench_command(argc, argv);
  std::cerr << "kvattn: unknown command '" << command
            << "' (expected explain, run, devices or bench; see kvattn --help)\n";
  return kExitUsage;
}
