// Timing one standard case on one backend: plan once, run repeatedly, report the median.
#pragma once

#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/machine.h"
#include "kvattn/status.h"

namespace kvattn::bench {

struct Rooflines {
  DramBandwidth dram;
  double fma_gflops = 0;
  double fma256_gflops = 0;    // with 256-bit vectors (the AVX2 kernels' peak)
  double bf16_dot_gflops = 0;  // 0: the CPU has no bf16 dot products
  double amx_bf16_gflops = 0;  // 0: the MLA kernels do not run on AMX tiles here
  // Where set, memory-bound cases take one DRAM pass after each timed run (the paired fraction).
  DramReader* dram_reader = nullptr;
};

struct CaseResult {
  std::string name, backend;
  std::string kernel;  // the plan's kernel (cpu: its kernel-table entry), "" where none is named
  double median_ms = 0, min_ms = 0, max_ms = 0;
  // Process CPU time per run (all threads), median: on a loaded machine wall time includes time
  // the threads waited for a core; cpu_ms / threads is what the run would take on idle cores.
  double median_cpu_ms = 0;
  double gbps = 0, gflops = 0;
  // gbps / dram (memory-bound), or gflops / the compute peak (fma, or bf16 dot for the cases that
  // run on it where the CPU has it)
  double roofline_fraction = 0;
  double bytes = 0, flops = 0;
  int repeats = 0, threads = 0;
  // Paged decode cases: a pure read of the same K/V pages in the kernel's order (no arithmetic),
  // its GB/s and the case's fraction of it (gbps / paged_read_gbps); 0 where not measured.
  double paged_read_gbps = 0, paged_read_fraction = 0;
  // Memory-bound cases with Rooflines::dram_reader: one DRAM pass after each timed run, the
  // median of those passes, and the median over the runs of (the run's GB/s / the pass after
  // it): the case against the bandwidth the host gave at that moment; 0 where not measured.
  double dram_paired_gbps = 0, dram_paired_fraction = 0;
};

// A case with its buffers made and its plan cut, ready to run many times.
class PreparedCase {
 public:
  // `backend`: auto | cpu | reference | ...; `num_threads` 0 = all cores.
  static Status prepare(const BenchCase& bench_case, const std::string& backend, int num_threads,
                        PreparedCase* out);
  PreparedCase();
  ~PreparedCase();
  PreparedCase(PreparedCase&&) noexcept;
  PreparedCase& operator=(PreparedCase&&) noexcept;

  Status run_once();
  // GB/s of a pure read of the bytes a paged decode reads (each request's K and V rows, page by
  // page in the order of the page table, a tile of pages after another as the kernel walks
  // them; requests, and chunks of long requests, shared by the threads as the kernel's tasks
  // are), median of `repeats` passes; 0 for anything but a paged decode.
  double measure_paged_read_gbps(int repeats);
  const std::string& backend() const;
  const std::string& kernel() const;  // Plan::kernel
  double bytes() const;
  double flops() const;
  int threads() const;

 private:
  struct State;
  State* state_ = nullptr;
};

// Runs `repeats` timed runs after one warm-up run and fills the figures.
Status time_case(const BenchCase& bench_case, PreparedCase& prepared, int repeats,
                 const Rooflines& rooflines, CaseResult* result);

}  // namespace kvattn::bench
