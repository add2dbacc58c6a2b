// kvattn_bench_ab: two standard cases timed alternately in one process (ABBA order), so that a
// ratio between them survives a loaded machine better than two separate runs do. Prints the
// medians and minimums of wall and process-CPU time per run(plan, args), and B / A.
//
//   kvattn_bench_ab CASE_A CASE_B [ROUNDS=15] [THREADS=1] [BACKEND=cpu]
//
// KVATTN_CPU_KERNEL_A / KVATTN_CPU_KERNEL_B name the cpu kernel each side's plan is made with
// (the kernel table's override, as KVATTN_CPU_KERNEL; a side without one plans as usual): the
// same case twice then compares two cpu kernels, e.g. CASE_A = CASE_B = decode_llama3_8b_e4m3
// with KVATTN_CPU_KERNEL_B=decode-avx512vbmi-fp8table-fma-k32.
// KVATTN_AB_ENV_A / KVATTN_AB_ENV_B = NAME=VALUE set that environment variable while that side's
// plan is made and during each of its runs, and put it back after (the switches the cpu backend
// reads at plan time or at every run, e.g. KVATTN_CPU_FMA_HEAD_STEPS=1): the same case twice then
// compares the two settings. Valid only where the switch's code does not change the other side's
// (a runtime branch inside a hot kernel can: compare separate builds there).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/cases.h"
#include "bench/harness.h"
#include "cpu/kernel_table.h"

namespace {

double now_ms(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double minimum(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  using namespace kvattn::bench;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CASE_A CASE_B [ROUNDS=15] [THREADS=1] [BACKEND=cpu]\n",
                 argv[0]);
    return 2;
  }
  const std::string names[2] = {argv[1], argv[2]};
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 15;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 1;
  const std::string backend = argc > 5 ? argv[5] : "cpu";
  // Each side's environment switch (NAME=VALUE), set before its plan is made (plan-time
  // switches) and before each of its runs (run-time switches).
  std::string env_name[2], env_value[2];
  for (int i = 0; i < 2; ++i) {
    const char* spec = std::getenv(i == 0 ? "KVATTN_AB_ENV_A" : "KVATTN_AB_ENV_B");
    if (spec == nullptr || *spec == '\0') continue;
    const std::string s(spec);
    const std::size_t eq = s.find('=');
    if (eq == 0 || eq == std::string::npos) {
      std::fprintf(stderr, "KVATTN_AB_ENV_%c=%s: expected NAME=VALUE\n", "AB"[i], spec);
      return 2;
    }
    env_name[i] = s.substr(0, eq);
    env_value[i] = s.substr(eq + 1);
  }
  // What the process had under each name, put back after each side's plan and run.
  std::string env_before[2];
  bool had_env[2] = {false, false};
  for (int i = 0; i < 2; ++i) {
    const char* v = env_name[i].empty() ? nullptr : std::getenv(env_name[i].c_str());
    had_env[i] = v != nullptr;
    if (had_env[i]) env_before[i] = v;
  }
  auto set_side = [&](int i) {
    if (!env_name[i].empty()) setenv(env_name[i].c_str(), env_value[i].c_str(), 1);
  };
  auto restore_side = [&](int i) {
    if (env_name[i].empty()) return;
    if (had_env[i]) {
      setenv(env_name[i].c_str(), env_before[i].c_str(), 1);
    } else {
      unsetenv(env_name[i].c_str());
    }
  };
  PreparedCase prepared[2];
  for (int i = 0; i < 2; ++i) {
    bool found = false;
    for (const BenchCase& c : standard_cases()) {
      if (c.name != names[i]) continue;
      found = true;
      // The plan is where the cpu kernel is chosen.
      if (const char* kernel =
              std::getenv(i == 0 ? "KVATTN_CPU_KERNEL_A" : "KVATTN_CPU_KERNEL_B")) {
        kvattn::cpu::set_cpu_kernel_override(kernel);
      }
      set_side(i);
      kvattn::Status s = PreparedCase::prepare(c, backend, threads, &prepared[i]);
      restore_side(i);
      kvattn::cpu::clear_cpu_kernel_override();
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", names[i].c_str(), s.to_string().c_str());
        return 1;
      }
    }
    if (!found) {
      std::fprintf(stderr, "no standard case %s (kvattn bench --list)\n", names[i].c_str());
      return 2;
    }
    set_side(i);
    (void)prepared[i].run_once();  // warm-up
    restore_side(i);
  }
  std::vector<double> wall[2], cpu[2];
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int i = r % 2 ? 1 - k : k;  // A B, B A, A B, ...
      set_side(i);
      const double w0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_PROCESS_CPUTIME_ID);
      kvattn::Status s = prepared[i].run_once();
      restore_side(i);
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", names[i].c_str(), s.to_string().c_str());
        return 1;
      }
      wall[i].push_back(now_ms(CLOCK_MONOTONIC) - w0);
      cpu[i].push_back(now_ms(CLOCK_PROCESS_CPUTIME_ID) - c0);
    }
  }
  for (int i = 0; i < 2; ++i) {
    std::printf("%-40s wall median %9.2f min %9.2f | cpu median %9.2f min %9.2f ms\n",
                names[i].c_str(), median(wall[i]), minimum(wall[i]), median(cpu[i]),
                minimum(cpu[i]));
  }
  // The ratio of each round's B run to its A run (run back to back), median over the rounds.
  std::vector<double> paired(rounds);
  for (int r = 0; r < rounds; ++r) paired[r] = wall[1][r] / wall[0][r];
  std::printf(
      "B / A (%d rounds, %d threads): wall median %.3f min %.3f paired %.3f | cpu median %.3f "
      "min %.3f\n",
      rounds, threads, median(wall[1]) / median(wall[0]), minimum(wall[1]) / minimum(wall[0]),
      median(paired), median(cpu[1]) / median(cpu[0]), minimum(cpu[1]) / minimum(cpu[0]));
  return 0;
}
