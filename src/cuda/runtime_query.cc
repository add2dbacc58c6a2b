// The CUDA devices of this machine, asked of the CUDA runtime. A missing driver, no GPU or any
// other runtime error means "no CUDA device" with the runtime's reason, never an abort.
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "core/cuda_query.h"

namespace kvattn::detail {

bool cuda_support_built() { return true; }

namespace {

void ask_the_runtime(std::vector<CudaDeviceInfo>* devices, std::string* status) {
  devices->clear();
  status->clear();
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // The runtime keeps the error sticky for the next call; clear it so later queries (and the
    // engine's own CUDA calls) do not inherit it.
    (void)cudaGetLastError();
    *status = std::string("no CUDA device: ") + cudaGetErrorString(err);
    return;
  }
  if (count == 0) {
    *status = "no CUDA device: the runtime reports 0 devices";
    return;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    CudaDeviceInfo info;
    info.index = i;
    info.sm = prop.major * 10 + prop.minor;
    info.name = prop.name;
    info.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
    devices->push_back(info);
  }
  if (devices->empty()) *status = "no CUDA device: properties of every device failed to read";
}

struct DeviceSet {
  std::vector<CudaDeviceInfo> devices;
  std::string status;
};

}  // namespace

// Asked once per process: the runtime enumerates its devices once anyway, and selection asks on
// every explain / select / plan.
void query_cuda_devices(std::vector<CudaDeviceInfo>* devices, std::string* status) {
  static const DeviceSet set = [] {
    DeviceSet s;
    ask_the_runtime(&s.devices, &s.status);
    return s;
  }();
  *devices = set.devices;
  *status = set.status;
}

}  // namespace kvattn::detail
