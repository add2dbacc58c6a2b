// Marks code usable from host C++ and CUDA device code alike.
#pragma once

#if defined(__CUDACC__)
#define KVATTN_HD __host__ __device__ __forceinline__
#else
#define KVATTN_HD inline
#endif
