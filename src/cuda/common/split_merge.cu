// The split-KV merge kernel of fa2 and fa3 (split_merge.h): one CTA per (merge row, query head),
// one thread per kMergeVector output dims. Compiled once, with the CUDA objects (every arch),
// and launched by both backends through its address.
#include <cuda_runtime.h>

#include "cuda/common/split_merge.h"

namespace kvattn::cuda {
namespace {

// 128 threads: D_vo up to 512 (fa2's largest head dim) at four dims per thread.
__global__ void __launch_bounds__(128) split_merge_kernel_body(const MergeParams p) {
  merge_thread(p, int64_t(blockIdx.x), int(blockIdx.y), int(threadIdx.x));
}

}  // namespace

const void* split_merge_kernel() { return reinterpret_cast<const void*>(split_merge_kernel_body); }

}  // namespace kvattn::cuda
