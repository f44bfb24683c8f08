// CUDA twins of comm/grad_cast.h's bucket casts.
#include <cuda_runtime.h>

#include "comm/grad_cast.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"

namespace ft {
namespace {

__global__ void to_bf16_kernel(bf16_bits* out, const float* in, int64_t count) {
  FT_GRID_STRIDE_LOOP(i, count) {
    out[i] = float_to_bf16(in[i]);
  }
}

__global__ void from_bf16_scaled_kernel(float* out, const bf16_bits* in, int64_t count,
                                        float scale) {
  FT_GRID_STRIDE_LOOP(i, count) {
    out[i] = bf16_to_float(in[i]) * scale;
  }
}

}  // namespace

void cuda_cast_to_bf16(bf16_bits* out, const float* in, int64_t count, CudaStream stream) {
  if (count <= 0) return;
  to_bf16_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(out, in,
                                                                                      count);
  FT_CUDA_CHECK_LAUNCH();
}

void cuda_cast_from_bf16_scaled(float* out, const bf16_bits* in, int64_t count, float scale,
                                CudaStream stream) {
  if (count <= 0) return;
  from_bf16_scaled_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(
      out, in, count, scale);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
