// This machine's rooflines, measured in the same run as the cases they judge (DESIGN.md §5).
#pragma once

namespace kvattn::bench {

// DRAM read bandwidth in GB/s (1e9 bytes/s): every thread streams its share of a working set of
// at least 1 GiB (32x the last-level cache of the machines this targets); best of several passes.
double measure_dram_read_gbps(int num_threads);
// fp32 FMA peak in GFLOP/s (an FMA = 2 FLOPs): every thread runs independent vector FMAs on
// registers, with the widest ISA the CPU has; best of several passes.
double measure_fma_gflops(int num_threads);
// bf16 dot-product peak in GFLOP/s (vdpbf16ps: 16 lanes x 2 products x 2 FLOPs), measured like
// the FMA peak; 0 where the CPU lacks AVX512_BF16.
double measure_bf16_dot_gflops(int num_threads);
// AMX-BF16 tile peak in GFLOP/s (TDPBF16PS: 16 x 16 x 32 multiply-adds), measured likewise; 0
// where the MLA kernels do not use AMX (no AMX, the OS refuses the tile state, or
// KVATTN_MLA_AMX=0).
double measure_amx_bf16_gflops(int num_threads);

}  // namespace kvattn::bench
