// The GPU bundle's one binary (scripts/gpu-bundle.sh, docs/cuda.md): the CUDA host tests (the CTA
// replays), fa2's and fa3's GPU tests and both GPU benchmarks behind one main, so one copy of the
// kernels travels instead of five.
//
//   kvattn_gpu_bundle device              the CUDA devices and what this build compiled; exit 0
//                                         with an SM80+ device, else 3 and "no CUDA device: why"
//   kvattn_gpu_bundle tests [gtest flags] the GoogleTest tests (select with --gtest_filter)
//   kvattn_gpu_bundle fa2-bench [--quick] [--backend fa3]
//   kvattn_gpu_bundle fa3-bench [--quick]
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_query.h"
#include "cuda/fa2/kernel_keys.h"
#include "cuda/fa3/kernel_keys.h"

int kvattn_fa2_gpu_bench_main(int argc, char** argv);
int kvattn_fa3_gpu_bench_main(int argc, char** argv);

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: kvattn_gpu_bundle device | tests [gtest flags] | fa2-bench [--quick] | "
               "fa3-bench [--quick]\n");
  return 2;
}

int device() {
  std::printf("fa2 kernels built: %d of %d\n", kvattn::fa2::kBuiltKernelCount,
              int(std::size(kvattn::fa2::kFullKernelKeys)));
  for (int i = 0; i < kvattn::fa2::kBuiltKernelCount; ++i) {
    std::printf("  fa2 %s\n",
                kvattn::fa2::kernel_key_string(kvattn::fa2::kBuiltKernelKeysStorage[i]).c_str());
  }
  std::printf("fa3 kernels built: %d of %d\n", kvattn::fa3::kBuiltKernelCount,
              int(std::size(kvattn::fa3::kImplementedKernelKeys)));
  for (int i = 0; i < kvattn::fa3::kBuiltKernelCount; ++i) {
    std::printf("  fa3 %s\n",
                kvattn::fa3::kernel_key_string(kvattn::fa3::kBuiltKernelKeysStorage[i]).c_str());
  }
  std::vector<kvattn::CudaDeviceInfo> devices;
  std::string why;
  kvattn::detail::query_cuda_devices(&devices, &why);
  int best_sm = 0;
  for (const kvattn::CudaDeviceInfo& d : devices) {
    std::printf("device cuda:%d %s sm%d %.0f GiB\n", d.index, d.name.c_str(), d.sm, d.memory_gib);
    best_sm = std::max(best_sm, d.sm);
  }
  if (devices.empty()) {
    // The runtime query's reason already reads "no CUDA device: ..." where it has one.
    if (why.empty()) why = "none found";
    if (why.rfind("no CUDA device", 0) != 0) why = "no CUDA device: " + why;
    std::printf("%s\n", why.c_str());
    return 3;
  }
  if (best_sm < 80) {
    std::printf("no CUDA device: none of SM80 or newer\n");
    return 3;
  }
  std::printf("sm %d\n", best_sm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  // A death test's child: GoogleTest re-executes this binary with the flags it was given after
  // `tests` (--gtest_filter=... --gtest_internal_run_death_test=...), without the subcommand.
  if (cmd.rfind("--gtest_", 0) == 0) {
    testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
  }
  // The subcommand's own argv: argv[0] kept, the subcommand dropped.
  std::vector<char*> rest{argv[0]};
  for (int i = 2; i < argc; ++i) rest.push_back(argv[i]);
  rest.push_back(nullptr);
  int n = int(rest.size()) - 1;
  if (cmd == "device") return device();
  if (cmd == "fa2-bench") return kvattn_fa2_gpu_bench_main(n, rest.data());
  if (cmd == "fa3-bench") return kvattn_fa3_gpu_bench_main(n, rest.data());
  if (cmd == "tests") {
    testing::InitGoogleTest(&n, rest.data());
    return RUN_ALL_TESTS();
  }
  return usage();
}
