// The bf16 fill, the widening and the bf16 operand sums of core/cuda/bf16_kernels.h. The sums
// follow the blocking of their fp32 twins in core/cuda/bias_activation_kernel.cu, widening each
// element with bf16_to_float (exact), so both sum the same fp32 values in a fixed order.
#include "core/cuda/bf16_kernels.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"

namespace ft {
namespace {

__global__ void fill_bf16_kernel(bf16_bits* data, int64_t count, bf16_bits value) {
  FT_GRID_STRIDE_LOOP(i, count) {
    data[i] = value;
  }
}

template <bool kAdd>
__global__ void widen_bf16_kernel(float* out, const bf16_bits* in, int64_t count) {
  FT_GRID_STRIDE_LOOP(i, count) {
    const float value = bf16_to_float(in[i]);
    out[i] = kAdd ? out[i] + value : value;
  }
}

// One warp per row, lanes striding over the columns, then a shuffle reduction.
constexpr int kWarpsPerBlock = kCudaThreadsPerBlock / 32;

__global__ void bf16_row_sums_kernel(float* sums, const bf16_bits* x, int64_t rows, int64_t cols,
                                     int64_t ld_x) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = first_row; row < rows; row += row_stride) {
    float sum = 0.0f;
    for (int64_t col = lane; col < cols; col += 32) sum += bf16_to_float(x[row * ld_x + col]);
    for (int offset = 16; offset > 0; offset /= 2)
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) sums[row] = sum;
  }
}

// A block owns kColumnTile adjacent columns (threadIdx.x) and kRowLanes row lanes (threadIdx.y)
// striding over the rows; the lanes' partial sums meet in shared memory in lane order.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 16;

__global__ void bf16_column_sums_kernel(float* sums, const bf16_bits* x, int64_t rows, int64_t cols,
                                        int64_t ld_x) {
  __shared__ float partial[kRowLanes][kColumnTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  float sum = 0.0f;
  if (col < cols)
    for (int64_t row = threadIdx.y; row < rows; row += kRowLanes)
      sum += bf16_to_float(x[row * ld_x + col]);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += partial[lane][threadIdx.x];
    sums[col] = total;
  }
}

}  // namespace

void cuda_fill_bf16(bf16_bits* data, int64_t count, bf16_bits value, CudaStream stream) {
  if (count <= 0) return;
  fill_bf16_kernel<<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(data, count,
                                                                                        value);
  FT_CUDA_CHECK_LAUNCH();
}

void cuda_widen_bf16(float* out, const bf16_bits* in, int64_t count, CudaStream stream) {
  if (count <= 0) return;
  widen_bf16_kernel<false>
      <<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(out, in, count);
  FT_CUDA_CHECK_LAUNCH();
}

void cuda_add_widened_bf16(float* out, const bf16_bits* in, int64_t count, CudaStream stream) {
  if (count <= 0) return;
  widen_bf16_kernel<true>
      <<<cuda_grid_stride_blocks(count), kCudaThreadsPerBlock, 0, stream>>>(out, in, count);
  FT_CUDA_CHECK_LAUNCH();
}

void bf16_row_sums_cuda(float* sums, const bf16_bits* x, int64_t rows, int64_t cols, int64_t ld_x,
                        CudaStream stream) {
  if (rows <= 0) return;
  const int64_t blocks =
      std::min<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kCudaMaxBlocks);
  bf16_row_sums_kernel<<<static_cast<unsigned int>(blocks), kCudaThreadsPerBlock, 0, stream>>>(
      sums, x, rows, cols, ld_x);
  FT_CUDA_CHECK_LAUNCH();
}

void bf16_column_sums_cuda(float* sums, const bf16_bits* x, int64_t rows, int64_t cols,
                           int64_t ld_x, CudaStream stream) {
  if (cols <= 0) return;
  const auto blocks = static_cast<unsigned int>((cols + kColumnTile - 1) / kColumnTile);
  bf16_column_sums_kernel<<<blocks, dim3(kColumnTile, kRowLanes), 0, stream>>>(sums, x, rows, cols,
                                                                               ld_x);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
