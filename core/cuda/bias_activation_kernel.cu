// The unfused epilogue kernels and the bias-gradient reductions (see bias_activation_kernel.h),
// over the GELU helpers of core/math/gelu_math.h that the CPU gemm() also calls.
#include "core/check.h"
#include "core/cuda/bias_activation_kernel.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/math/gelu_math.h"

namespace ft {
namespace {

enum class Activation { kIdentity, kRelu, kGelu };

// One grid-stride loop over batch * rows * cols elements; element i sits at column i % cols of
// row (i / cols) % rows of matrix i / (rows * cols).
template <Activation kActivation>
__global__ void epilogue_forward_kernel(float* c, float* aux, const float* bias, int64_t batch,
                                        int64_t rows, int64_t cols, int64_t ldc,
                                        int64_t batch_stride_c, int64_t ld_aux) {
  const int64_t per_matrix = rows * cols;
  FT_GRID_STRIDE_LOOP(i, batch * per_matrix) {
    const int64_t matrix = i / per_matrix, row = (i % per_matrix) / cols, col = i % cols;
    float* entry = c + matrix * batch_stride_c + row * ldc + col;
    float value = *entry;
    if (bias != nullptr) value += bias[col];
    if (aux != nullptr) aux[row * ld_aux + col] = value;
    if (kActivation == Activation::kRelu) value = fmaxf(value, 0.0f);
    if (kActivation == Activation::kGelu) value = gelu_tanh(value);
    *entry = value;
  }
}

__global__ void dgelu_in_place_kernel(float* x, const float* pre, int64_t rows, int64_t cols,
                                      int64_t ld_x, int64_t ld_pre) {
  FT_GRID_STRIDE_LOOP(i, rows * cols) {
    const int64_t row = i / cols, col = i % cols;
    x[row * ld_x + col] *= gelu_tanh_grad(pre[row * ld_pre + col]);
  }
}

// A block owns kColumnTile adjacent columns (threadIdx.x, so a warp reads 32 consecutive floats
// of a row) and kRowLanes row lanes (threadIdx.y) that stride over the rows; the lanes' partial
// sums meet in shared memory. The order of additions is fixed, so results are deterministic.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 16;

__global__ void column_sums_kernel(float* sums, bool accumulate, float* values_out, const float* x,
                                   const float* pre, int64_t rows, int64_t cols, int64_t ld_out,
                                   int64_t ld_x, int64_t ld_pre) {
  __shared__ float partial[kRowLanes][kColumnTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t row = threadIdx.y; row < rows; row += kRowLanes) {
      float value = x[row * ld_x + col];
      if (pre != nullptr) value *= gelu_tanh_grad(pre[row * ld_pre + col]);
      if (values_out != nullptr) values_out[row * ld_out + col] = value;
      sum += value;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols && sums != nullptr) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += partial[lane][threadIdx.x];
    sums[col] = accumulate ? sums[col] + total : total;
  }
}

// One warp per row, lanes striding over the columns, then a shuffle reduction.
constexpr int kWarpsPerBlock = kCudaThreadsPerBlock / 32;

__global__ void row_sums_kernel(float* sums, const float* x, int64_t rows, int64_t cols,
                                int64_t ld_x) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = first_row; row < rows; row += row_stride) {
    float sum = 0.0f;
    for (int64_t col = lane; col < cols; col += 32) sum += x[row * ld_x + col];
    for (int offset = 16; offset > 0; offset /= 2)
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) sums[row] = sum;
  }
}

using EpilogueForwardKernel = decltype(&epilogue_forward_kernel<Activation::kIdentity>);

// The instantiation for a forward epilogue, so the launcher has one launch site (and one
// FT_CUDA_CHECK_LAUNCH, which counts it).
EpilogueForwardKernel epilogue_forward_kernel_for(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::kNone:
      return epilogue_forward_kernel<Activation::kIdentity>;
    case Epilogue::kRelu:
      return epilogue_forward_kernel<Activation::kRelu>;
    case Epilogue::kGeluTanh:
    case Epilogue::kGeluTanhAux:
      return epilogue_forward_kernel<Activation::kGelu>;
    default:
      FT_FAIL("epilogue_forward_cuda: ", epilogue_name(epilogue), " is not a forward epilogue");
  }
}

}  // namespace

void epilogue_forward_cuda(float* c, float* aux, const float* bias, Epilogue epilogue,
                           int64_t batch, int64_t rows, int64_t cols, int64_t ldc,
                           int64_t batch_stride_c, int64_t ld_aux, cudaStream_t stream) {
  FT_CHECK(batch >= 0 && rows >= 0 && cols >= 0, "epilogue_forward_cuda: batch = ", batch,
           ", rows = ", rows, ", cols = ", cols);
  FT_CHECK(
      (aux != nullptr) == (epilogue == Epilogue::kGeluTanhAux) && (aux == nullptr || batch == 1),
      "epilogue_forward_cuda: aux must be given exactly for gelu_tanh_aux, with batch 1");
  const int64_t total = batch * rows * cols;
  if (total == 0 || (bias == nullptr && epilogue == Epilogue::kNone)) return;
  const EpilogueForwardKernel kernel = epilogue_forward_kernel_for(epilogue);
  kernel<<<cuda_grid_stride_blocks(total), kCudaThreadsPerBlock, 0, stream>>>(
      c, aux, bias, batch, rows, cols, ldc, batch_stride_c, ld_aux);
  FT_CUDA_CHECK_LAUNCH();
}

void dgelu_in_place_cuda(float* x, const float* pre, int64_t rows, int64_t cols, int64_t ld_x,
                         int64_t ld_pre, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  dgelu_in_place_kernel<<<cuda_grid_stride_blocks(rows * cols), kCudaThreadsPerBlock, 0, stream>>>(
      x, pre, rows, cols, ld_x, ld_pre);
  FT_CUDA_CHECK_LAUNCH();
}

void column_sums_cuda(float* sums, bool accumulate, float* values_out, const float* x,
                      const float* pre, int64_t rows, int64_t cols, int64_t ld_out, int64_t ld_x,
                      int64_t ld_pre, cudaStream_t stream) {
  if (cols <= 0) return;
  if (rows <= 0 && accumulate) return;
  const auto blocks = static_cast<unsigned int>((cols + kColumnTile - 1) / kColumnTile);
  column_sums_kernel<<<blocks, dim3(kColumnTile, kRowLanes), 0, stream>>>(
      sums, accumulate, values_out, x, pre, rows, cols, ld_out, ld_x, ld_pre);
  FT_CUDA_CHECK_LAUNCH();
}

void row_sums_cuda(float* sums, const float* x, int64_t rows, int64_t cols, int64_t ld_x,
                   cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t blocks =
      std::min<int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kCudaMaxBlocks);
  row_sums_kernel<<<static_cast<unsigned int>(blocks), kCudaThreadsPerBlock, 0, stream>>>(
      sums, x, rows, cols, ld_x);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
