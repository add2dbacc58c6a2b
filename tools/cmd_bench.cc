// kvattn bench: the benchmark harness of bench/ (kvattn_benchcore), when it is built.
#include <iostream>

#include "tools/cli_args.h"
#include "tools/commands.h"

#ifdef KVATTN_HAVE_BENCHCORE
#include "bench/bench_cli.h"
#endif

namespace kvattn::tools {

int bench_command(int argc, char** argv) {
#ifdef KVATTN_HAVE_BENCHCORE
  // argv[0] of the harness is "bench"; its flags follow.
  return kvattn::bench::bench_main(argc - 1, argv + 1);
#else
  (void)argc;
  (void)argv;
  std::cerr << "kvattn bench: not built (this build has no benchmark harness, kvattn_benchcore)\n";
  return kExitUnsupported;
#endif
}

}  // namespace kvattn::tools
