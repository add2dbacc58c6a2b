#include "bench/bench_cli.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <regex>
#include <string>

#include "bench/cases.h"
#include "bench/harness.h"
#include "bench/machine.h"
#include "core/cpu_features.h"
#include "cpu/common/thread_pool.h"

namespace kvattn::bench {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitFailed = 1;

struct Options {
  bool json = false;
  bool list = false;
  std::string filter;
  int repeats = 5;
  std::string backend = "auto";
  int threads = 0;
};

void usage(std::ostream& os) {
  os << "usage: kvattn bench [--json] [--filter REGEX] [--repeats N] [--backend NAME] "
        "[--threads N] [--list]\n";
}

bool parse_int(const std::string& text, int min, int* out) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < min || v > 1'000'000) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) {
        std::cerr << "kvattn bench: " << arg << " needs a value\n";
        return false;
      }
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "--json") {
      o->json = true;
    } else if (arg == "--list") {
      o->list = true;
    } else if (arg == "--filter") {
      if (!value(&o->filter)) return false;
    } else if (arg == "--backend") {
      if (!value(&o->backend)) return false;
    } else if (arg == "--repeats" || arg == "--threads") {
      if (!value(&v)) return false;
      int* target = arg == "--repeats" ? &o->repeats : &o->threads;
      if (!parse_int(v, arg == "--repeats" ? 1 : 0, target)) {
        std::cerr << "kvattn bench: " << arg << " " << v
                  << ": expected an integer >= " << (arg == "--repeats" ? 1 : 0) << "\n";
        return false;
      }
    } else if (arg == "--help" || arg == "-h") {
      usage(std::cout);
      std::exit(kExitOk);
    } else {
      std::cerr << "kvattn bench: unknown flag '" << arg << "'\n";
      return false;
    }
  }
  return true;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

void print_json(const CaseResult& r, const Rooflines& m) {
  std::printf(
      "{\"name\":%s,\"backend\":%s,\"median_ms\":%.4f,\"min_ms\":%.4f,\"max_ms\":%.4f,"
      "\"median_cpu_ms\":%.4f,\"gbps\":%.3f,\"gflops\":%.3f,\"roofline_fraction\":%.4f,"
      "\"paged_read_gbps\":%.3f,\"paged_read_fraction\":%.4f,"
      "\"dram_paired_gbps\":%.3f,\"dram_paired_fraction\":%.4f,"
      "\"dram_gbps\":%.3f,\"dram_gbps_min\":%.3f,\"dram_gbps_max\":%.3f,"
      "\"dram_spread\":%.4f,\"dram_passes\":%d,\"bytes_per_s_per_core\":%.4g,"
      "\"fma_gflops\":%.3f,\"fma256_gflops\":%.3f,\"bf16_dot_gflops\":%.3f,"
      "\"amx_bf16_gflops\":%.3f,"
      "\"bytes\":%.0f,\"flops\":%.0f,\"repeats\":%d,\"threads\":%d,\"cpu_isa\":%s,"
      "\"kernel\":%s}\n",
      json_string(r.name).c_str(), json_string(r.backend).c_str(), r.median_ms, r.min_ms, r.max_ms,
      r.median_cpu_ms, r.gbps, r.gflops, r.roofline_fraction, r.paged_read_gbps,
      r.paged_read_fraction, r.dram_paired_gbps, r.dram_paired_fraction, m.dram.gbps,
      m.dram.min_gbps, m.dram.max_gbps, m.dram.spread(), m.dram.passes, m.dram.bytes_per_s_per_core,
      m.fma_gflops, m.fma256_gflops, m.bf16_dot_gflops, m.amx_bf16_gflops, r.bytes, r.flops,
      r.repeats, r.threads,
      json_string(std::string(cpu_isa_name(detail::effective_cpu_isa()))).c_str(),
      json_string(r.kernel).c_str());
  std::fflush(stdout);
}

}  // namespace

int bench_main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) {
    usage(std::cerr);
    return kExitUsage;
  }
  std::regex filter;
  try {
    filter = std::regex(o.filter);
  } catch (const std::regex_error& e) {
    std::cerr << "kvattn bench: --filter '" << o.filter << "': " << e.what() << "\n";
    return kExitUsage;
  }
  std::vector<BenchCase> cases;
  for (BenchCase& c : standard_cases()) {
    if (o.filter.empty() || std::regex_search(c.name, filter)) cases.push_back(std::move(c));
  }
  if (o.list) {
    for (const BenchCase& c : cases) std::cout << c.name << "\n";
    return kExitOk;
  }
  if (cases.empty()) {
    std::cerr << "kvattn bench: no case matches --filter '" << o.filter << "'\n";
    return kExitUsage;
  }

  Rooflines m;
  DramReader dram(o.threads);
  m.dram = dram.measure();
  m.dram_reader = &dram;
  m.fma_gflops = measure_fma_gflops(o.threads);
  m.fma256_gflops = measure_fma256_gflops(o.threads);
  m.bf16_dot_gflops = measure_bf16_dot_gflops(o.threads);
  m.amx_bf16_gflops = measure_amx_bf16_gflops(o.threads);
  if (!o.json) {
    std::printf(
        "machine: %d threads, DRAM read %.1f GB/s (median of %d passes, %.1f-%.1f; one core "
        "%.1f GB/s), fp32 FMA peak %.1f GFLOP/s (256-bit vectors %.1f), bf16 dot peak %.1f "
        "GFLOP/s, AMX bf16 peak "
        "%.1f GFLOP/s, isa %s\n",
        cpu::resolve_num_threads(o.threads), m.dram.gbps, m.dram.passes, m.dram.min_gbps,
        m.dram.max_gbps, m.dram.bytes_per_s_per_core / 1e9, m.fma_gflops, m.fma256_gflops,
        m.bf16_dot_gflops, m.amx_bf16_gflops,
        std::string(cpu_isa_name(detail::effective_cpu_isa())).c_str());
    std::printf("%-36s %-9s %10s %9s %10s %9s %10s %11s %11s\n", "case", "backend", "median_ms",
                "GB/s", "GFLOP/s", "roofline", "cpu_ms", "paged_read", "dram_paired");
  }
  int failures = 0;
  for (const BenchCase& c : cases) {
    PreparedCase prepared;
    CaseResult r;
    Status s = PreparedCase::prepare(c, o.backend, o.threads, &prepared);
    if (s.ok()) s = time_case(c, prepared, o.repeats, m, &r);
    if (!s.ok()) {
      ++failures;
      std::cerr << "kvattn bench: " << c.name << ": " << s.to_string() << "\n";
      continue;
    }
    if (o.json) {
      print_json(r, m);
    } else {
      std::printf("%-36s %-9s %10.3f %9.2f %10.2f %8.1f%% %10.3f %10.1f%% %10.1f%%\n",
                  r.name.c_str(), r.backend.c_str(), r.median_ms, r.gbps, r.gflops,
                  100 * r.roofline_fraction, r.median_cpu_ms, 100 * r.paged_read_fraction,
                  100 * r.dram_paired_fraction);
      std::fflush(stdout);
    }
  }
  return failures ? kExitFailed : kExitOk;
}

}  // namespace kvattn::bench
