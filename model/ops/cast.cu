// CastOp on CUDA: the rounding of core/math/bf16_math.h, shared with the CPU loops.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "model/ops/cast.h"

namespace ft {
namespace {

__global__ void cast_forward_kernel(bf16_bits* y, const float* x, int64_t rows, int64_t cols,
                                    int64_t y_stride, int64_t x_stride) {
  FT_GRID_STRIDE_LOOP(i, rows * cols) {
    const int64_t row = i / cols, col = i % cols;
    y[row * y_stride + col] = float_to_bf16(x[row * x_stride + col]);
  }
}

template <bool kFresh>
__global__ void cast_backward_kernel(float* dx, const float* dy, int64_t rows, int64_t cols,
                                     int64_t dx_stride, int64_t dy_stride) {
  FT_GRID_STRIDE_LOOP(i, rows * cols) {
    const int64_t row = i / cols, col = i % cols;
    const float gradient = dy[row * dy_stride + col];
    float& out = dx[row * dx_stride + col];
    out = kFresh ? gradient : out + gradient;
  }
}

}  // namespace

void cast_forward_cuda(bf16_bits* y, const float* x, int64_t rows, int64_t cols, int64_t y_stride,
                       int64_t x_stride, CudaStream stream) {
  if (rows * cols <= 0) return;
  if (y_stride == 0) y_stride = cols;
  if (x_stride == 0) x_stride = cols;
  cast_forward_kernel<<<cuda_grid_stride_blocks(rows * cols), kCudaThreadsPerBlock, 0, stream>>>(
      y, x, rows, cols, y_stride, x_stride);
  FT_CUDA_CHECK_LAUNCH();
}

void cast_backward_cuda(float* dx, const float* dy, int64_t rows, int64_t cols, int64_t dx_stride,
                        int64_t dy_stride, bool dx_fresh, CudaStream stream) {
  if (rows * cols <= 0) return;
  if (dx_stride == 0) dx_stride = cols;
  if (dy_stride == 0) dy_stride = cols;
  const auto kernel = dx_fresh ? cast_backward_kernel<true> : cast_backward_kernel<false>;
  kernel<<<cuda_grid_stride_blocks(rows * cols), kCudaThreadsPerBlock, 0, stream>>>(
      dx, dy, rows, cols, dx_stride, dy_stride);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
