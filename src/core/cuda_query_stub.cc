// Built when CUDA support is off.
#include "core/cuda_query.h"

namespace kvattn::detail {

bool cuda_support_built() { return false; }

void query_cuda_devices(std::vector<CudaDeviceInfo>* devices, std::string* status) {
  devices->clear();
  *status = "CUDA support not built (configure with -DKVATTN_CUDA=ON and nvcc present)";
}

}  // namespace kvattn::detail
