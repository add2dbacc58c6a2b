// This machine's rooflines, measured in the same run as the cases they judge (DESIGN.md §5).
#pragma once

namespace kvattn::bench {

// DRAM read bandwidth in GB/s (1e9 bytes/s): every thread streams its share of a working set of
// at least 1 GiB (32x the last-level cache of the machines this targets); best of several passes.
double measure_dram_read_gbps(int num_threads);
// fp32 FMA peak in GFLOP/s (an FMA = 2 FLOPs): every thread runs independent vector FMAs on
// registers, with the widest ISA the CPU has; best of several passes.
double measure_fma_gflops(int num_threads);

}  // namespace kvattn::bench
