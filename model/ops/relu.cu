// ReLU on CUDA: elementwise kernels over relu_value / relu_gradient (model/ops/relu.h), the
// helpers of the CPU loops. Backward reads y, as the CPU does (y > 0 exactly where x > 0).
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

__global__ void relu_forward_kernel(float* y, const float* x, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    y[i] = relu_value(x[i]);
  }
}

// `=` for a fresh gradient (the executor hands over stale memory), else `+=`.
template <bool kFresh>
__global__ void relu_backward_kernel(float* dx, const float* dy, const float* y, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const float gradient = relu_gradient(dy[i], y[i]);
    dx[i] = kFresh ? gradient : dx[i] + gradient;
  }
}

}  // namespace

void relu_forward_cuda(float* y, const float* x, int64_t numel, CudaStream stream) {
  if (numel <= 0) return;
  relu_forward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(y, x,
                                                                                           numel);
  FT_CUDA_CHECK_LAUNCH();
}

void relu_backward_cuda(float* dx, const float* dy, const float* y, int64_t numel, bool dx_fresh,
                        CudaStream stream) {
  if (numel <= 0) return;
  const auto kernel = dx_fresh ? relu_backward_kernel<true> : relu_backward_kernel<false>;
  kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(dx, dy, y, numel);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
