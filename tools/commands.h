// The subcommands of the kvattn command line. Each takes the whole argument list (args[0] is the
// subcommand's name), prints to stdout/stderr and returns an ExitCode (tools/cli_args.h).
#pragma once

#include <string>
#include <vector>

namespace kvattn::tools {

int explain_main(const std::vector<std::string>& args);
int run_main(const std::vector<std::string>& args);
int devices_main(const std::vector<std::string>& args);
// Delegates to the benchmark harness when it is built (kvattn_benchcore), else exit 3.
int bench_command(int argc, char** argv);

// The help text shared by the subcommands that take a problem.
std::string problem_flags_help();

}  // namespace kvattn::tools
