// KVATTN_FA3_PRAGMA(x): a loop pragma (unroll) for nvcc in fa3's host/device kernel headers, and
// nothing for the host compiler of the CPU replay.
#pragma once

#if defined(__CUDACC__)
#define KVATTN_FA3_PRAGMA(x) _Pragma(#x)
#else
#define KVATTN_FA3_PRAGMA(x)
#endif
