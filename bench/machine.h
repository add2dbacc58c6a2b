// This machine's rooflines, measured in the same run as the cases they judge (DESIGN.md §5).
#pragma once

namespace kvattn::bench {

// DRAM read bandwidth (GB/s = 1e9 bytes/s). Every thread streams its contiguous share of a
// working set on huge pages far past the last-level cache (at least 1 GiB and 8x the L3), all
// threads at once; `gbps` is the median of the passes, min/max their spread. On a VM the best of
// a few passes moved 1.7x between two runs on an idle machine (issue 14); the median of more
// passes, with its spread reported, is the denominator every decode figure is divided by.
struct DramBandwidth {
  double gbps = 0, min_gbps = 0, max_gbps = 0;
  double bytes_per_s_per_core = 0;  // one thread streaming alone (median of the passes)
  double buffer_bytes = 0;
  int passes = 0;
  // (max - min) / median of the all-thread passes.
  double spread() const { return gbps > 0 ? (max_gbps - min_gbps) / gbps : 0; }
};
DramBandwidth measure_dram_read(int num_threads);
// fp32 FMA peak in GFLOP/s (an FMA = 2 FLOPs): every thread runs independent vector FMAs on
// registers, with the widest ISA the CPU has; best of several passes.
double measure_fma_gflops(int num_threads);
// bf16 dot-product peak in GFLOP/s (vdpbf16ps: 16 lanes x 2 products x 2 FLOPs), measured like
// the FMA peak; 0 where the CPU lacks AVX512_BF16.
double measure_bf16_dot_gflops(int num_threads);
// AMX-BF16 tile peak in GFLOP/s (TDPBF16PS: 16 x 16 x 32 multiply-adds), measured likewise; 0
// where the MLA kernels cannot use AMX (no AMX, or the OS refuses the tile state).
double measure_amx_bf16_gflops(int num_threads);

}  // namespace kvattn::bench
