// LayerNorm -> cast and GELU -> cast on CUDA: the kernels, then their launchers. LayerNorm is one
// warp per row (8 rows per block), as kernels/layernorm.cu and residual_layernorm.cu, through
// the bf16 row helper of fusion/ops/layernorm_bf16_row.cuh; GELU is a grid-stride loop over
// core/math/gelu_math.h. Both round with core/math/bf16_math.h, so they write the bits their CPU
// twins in layernorm_cast.cpp write from the same fp32 values.
#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/math/gelu_math.h"
#include "fusion/ops/layernorm_bf16_row.cuh"
#include "fusion/ops/layernorm_cast.h"

namespace ft {
namespace {

constexpr int kRowsPerBlock = kCudaThreadsPerBlock / kLayerNormWarp;

// The row index is uniform in a warp, so whole warps leave past the last row and the shuffles
// see all lanes.
__global__ void layernorm_cast_forward_kernel(bf16_bits* y, float* mean, float* rstd,
                                              const float* x, const float* weight,
                                              const float* bias, int64_t rows, int64_t channels,
                                              int64_t y_stride, int64_t x_stride) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLayerNormWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kLayerNormWarp;
  float row_mean, row_rstd;
  layernorm_warp_row_forward_bf16(y + row * y_stride, &row_mean, &row_rstd, x + row * x_stride,
                                  weight, bias, channels, kLayerNormEps, lane);
  if (lane == 0) {
    mean[row] = row_mean;
    rstd[row] = row_rstd;
  }
}

__global__ void gelu_cast_forward_kernel(bf16_bits* y, const float* x, int64_t rows, int64_t cols,
                                         int64_t y_stride, int64_t x_stride) {
  FT_GRID_STRIDE_LOOP(i, rows * cols) {
    const int64_t row = i / cols, col = i % cols;
    y[row * y_stride + col] = float_to_bf16(gelu_tanh(x[row * x_stride + col]));
  }
}

}  // namespace

void layernorm_cast_forward_cuda(bf16_bits* y, float* mean, float* rstd, const float* x,
                                 const float* weight, const float* bias, int64_t rows,
                                 int64_t channels, int64_t y_stride, int64_t x_stride,
                                 CudaStream stream) {
  FT_CHECK(rows > 0 && rows <= static_cast<int64_t>(0x7fffffff) * kRowsPerBlock,
           "layernorm_cast (cuda): ", rows, " rows do not fit the launch grid");
  if (y_stride == 0) y_stride = channels;
  if (x_stride == 0) x_stride = channels;
  const auto blocks = static_cast<unsigned int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  layernorm_cast_forward_kernel<<<blocks, kCudaThreadsPerBlock, 0, stream>>>(
      y, mean, rstd, x, weight, bias, rows, channels, y_stride, x_stride);
  FT_CUDA_CHECK_LAUNCH();
}

void gelu_cast_forward_cuda(bf16_bits* y, const float* x, int64_t rows, int64_t cols,
                            int64_t y_stride, int64_t x_stride, CudaStream stream) {
  if (rows * cols <= 0) return;
  if (y_stride == 0) y_stride = cols;
  if (x_stride == 0) x_stride = cols;
  gelu_cast_forward_kernel<<<cuda_grid_stride_blocks(rows * cols), kCudaThreadsPerBlock, 0,
                             stream>>>(y, x, rows, cols, y_stride, x_stride);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
