// FT_HD marks math helpers shared by CPU and CUDA kernels, so CPU tests cover the GPU's math.
#pragma once
#if defined(__CUDACC__)
#define FT_HD __host__ __device__ inline
#else
#define FT_HD inline
#endif
