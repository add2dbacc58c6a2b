// `kvattn bench`: measures this machine's DRAM read bandwidth and fp32 FMA peak, then runs the
// standard cases (cases.h) and reports median time, GB/s or GFLOP/s and the roofline fraction.
//   --json           one JSON object per case and line
//   --filter REGEX   only the cases whose name matches (std::regex_search)
//   --repeats N      timed runs per case (default 5; the median is reported)
//   --backend NAME   auto | cpu | reference | fa2 | fa3 (default auto)
//   --threads N      threads for the cpu backend (default 0: all cores)
//   --list           print the case names and exit
#pragma once

namespace kvattn::bench {

// argv[0] is the command name ("bench"); returns a process exit code.
int bench_main(int argc, char** argv);

}  // namespace kvattn::bench
