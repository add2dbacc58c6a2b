// The standard cases (cases.h) as Google Benchmark benchmarks: bytes and FLOPs per iteration as
// rate counters. `kvattn bench` is the tool that also measures the rooflines.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "bench/cases.h"
#include "bench/harness.h"

namespace kvattn::bench {
namespace {

void run_case(benchmark::State& state, const BenchCase& bench_case, const std::string& backend) {
  PreparedCase prepared;
  Status s = PreparedCase::prepare(bench_case, backend, 0, &prepared);
  if (s.ok()) s = prepared.run_once();
  if (!s.ok()) {
    state.SkipWithError(s.to_string().c_str());
    return;
  }
  for (auto _ : state) {
    s = prepared.run_once();
    if (!s.ok()) {
      state.SkipWithError(s.to_string().c_str());
      return;
    }
  }
  state.counters["bytes_per_second"] = benchmark::Counter(
      prepared.bytes(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["flops"] = benchmark::Counter(
      prepared.flops(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.SetLabel(prepared.backend());
}

}  // namespace
}  // namespace kvattn::bench

int main(int argc, char** argv) {
  // KVATTN_BENCH_BACKEND picks the backend (default auto).
  const char* env = std::getenv("KVATTN_BENCH_BACKEND");
  const std::string backend = env ? env : "auto";
  for (const kvattn::bench::BenchCase& c : kvattn::bench::standard_cases()) {
    benchmark::RegisterBenchmark(
        c.name.c_str(),
        [c, backend](benchmark::State& state) { kvattn::bench::run_case(state, c, backend); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
