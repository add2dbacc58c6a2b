// This machine's rooflines, measured in the same run as the cases they judge (DESIGN.md §5).
#pragma once

#include <memory>

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

// The DRAM read: its working set, measured at the start of a run (measure) and kept for single
// passes taken between a case's timed runs (the paired fraction, harness.h): on a VM the
// bandwidth moves within one run (27.4-49.5 GB/s across the 9 passes of one run on the Zen 4 VM,
// 2026-12-03), so a decode's GB/s divided by the median of passes taken seconds earlier moves
// with the host, not with the kernel.
class DramReader {
 public:
  explicit DramReader(int num_threads);  // allocates and touches the working set
  ~DramReader();
  DramReader(const DramReader&) = delete;
  DramReader& operator=(const DramReader&) = delete;
  // GB/s of one pass, all threads at once.
  double pass_gbps();
  // The start measurement: 9 all-thread passes and 9 one-core passes (DramBandwidth).
  DramBandwidth measure();

 private:
  struct Buffer;
  std::unique_ptr<Buffer> buffer_;
};

// fp32 FMA peak in GFLOP/s (an FMA = 2 FLOPs): every thread runs independent vector FMAs on
// registers, with the widest ISA the CPU has; best of several passes.
double measure_fma_gflops(int num_threads);
// The same with 256-bit vectors (AVX2 + FMA): the peak of the AVX2 kernels on a CPU that also has
// AVX-512 (e.g. Zen 3's kernels measured on a Zen 5, where 512-bit FMAs run at twice the rate).
// The FMA peak itself where the CPU has no AVX-512; the portable loop's without AVX2.
double measure_fma256_gflops(int num_threads);
// bf16 dot-product peak in GFLOP/s (vdpbf16ps: 16 lanes x 2 products x 2 FLOPs), measured like
// the FMA peak; 0 where the CPU lacks AVX512_BF16.
double measure_bf16_dot_gflops(int num_threads);
// AMX-BF16 tile peak in GFLOP/s (TDPBF16PS: 16 x 16 x 32 multiply-adds), measured likewise; 0
// where the MLA kernels cannot use AMX (no AMX, or the OS refuses the tile state).
double measure_amx_bf16_gflops(int num_threads);

}  // namespace kvattn::bench
