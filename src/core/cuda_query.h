// The CUDA devices of this machine. Implemented by src/cuda/ when CUDA support is built, and by
// a stub that says so otherwise. Never aborts: a missing driver or GPU is reported in `status`.
#pragma once

#include <string>
#include <vector>

#include "kvattn/device.h"

namespace kvattn::detail {

bool cuda_support_built();
// Fills `devices` (possibly empty) and, when empty, `status` with why.
void query_cuda_devices(std::vector<CudaDeviceInfo>* devices, std::string* status);

}  // namespace kvattn::detail
