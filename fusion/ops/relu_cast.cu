// ReluCastOp on CUDA: elementwise kernels over relu_cast_value / relu_cast_gradient
// (relu_cast.h), the helpers of the CPU loops, so both devices write the same bf16 bits and read
// the mask from the bf16 y alike. Compiled, not yet run on a GPU.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "fusion/ops/relu_cast.h"

namespace ft {
namespace {

__global__ void relu_cast_forward_kernel(bf16_bits* y, const float* x, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    y[i] = relu_cast_value(x[i]);
  }
}

// `=` for a fresh gradient (the executor hands over stale memory), else `+=`.
template <bool kFresh>
__global__ void relu_cast_backward_kernel(float* dx, const float* dy, const bf16_bits* y,
                                          int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const float gradient = relu_cast_gradient(dy[i], y[i]);
    dx[i] = kFresh ? gradient : dx[i] + gradient;
  }
}

}  // namespace

void relu_cast_forward_cuda(bf16_bits* y, const float* x, int64_t numel, CudaStream stream) {
  if (numel <= 0) return;
  relu_cast_forward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      y, x, numel);
  FT_CUDA_CHECK_LAUNCH();
}

void relu_cast_backward_cuda(float* dx, const float* dy, const bf16_bits* y, int64_t numel,
                             bool dx_fresh, CudaStream stream) {
  if (numel <= 0) return;
  const auto kernel = dx_fresh ? relu_cast_backward_kernel<true> : relu_cast_backward_kernel<false>;
  kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(dx, dy, y, numel);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
