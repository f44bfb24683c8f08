// GELU on CUDA: the kernels, then their launchers, over the helpers of core/math/gelu_math.h that
// the CPU loops in gelu.cpp also call, so CPU tests cover the math.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/math/gelu_math.h"
#include "kernels/gelu.h"

namespace ft {
namespace {

__global__ void gelu_forward_kernel(float* y, const float* x, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    y[i] = gelu_tanh(x[i]);
  }
}

// Chain rule: dx = dy * gelu'(x). The += keeps gradients that reach x through other ops.
__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    dx[i] += dy[i] * gelu_tanh_grad(x[i]);
  }
}

}  // namespace

void gelu_forward_cuda(float* y, const float* x, int64_t numel, CudaStream stream) {
  if (numel <= 0) return;
  gelu_forward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(y, x,
                                                                                           numel);
  FT_CUDA_CHECK_LAUNCH();
}

void gelu_backward_cuda(float* dx, const float* dy, const float* x, int64_t numel,
                        CudaStream stream) {
  if (numel <= 0) return;
  gelu_backward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      dx, dy, x, numel);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
