// kvattn devices: what this machine has.
#include <iostream>

#include "kvattn/device.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace kvattn::tools {

int devices_main(const std::vector<std::string>& args) {
  if (args.size() > 1) {
    if (args[1] == "--help" || args[1] == "-h") {
      std::cout << "usage: kvattn devices\n\nPrints the CPU's ISA level (the one the kernels use), "
                   "its features and threads,\nand the CUDA devices, or why there are none.\n";
      return kExitOk;
    }
    std::cerr << "kvattn devices: unexpected argument '" << args[1] << "'\n";
    return kExitUsage;
  }
  MachineDevices m = query_devices();
  std::cout << "cpu: isa " << cpu_isa_name(m.cpu_isa) << ", " << m.cpu_threads << " threads\n"
            << "  features: " << (m.cpu_features.empty() ? "(none detected)" : m.cpu_features)
            << '\n';
  if (m.cuda.empty()) {
    std::cout << "cuda: none (" << (m.cuda_status.empty() ? "no device found" : m.cuda_status)
              << ")\n";
  } else {
    for (const CudaDeviceInfo& d : m.cuda) {
      std::cout << "cuda:" << d.index << ": sm" << d.sm << ", " << d.name << ", " << d.memory_gib
                << " GiB\n";
    }
  }
  return kExitOk;
}

}  // namespace kvattn::tools
