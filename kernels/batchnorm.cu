// BatchNorm on CUDA over NHWC [rows, C], with the helpers of kernels/batchnorm_math.h that the
// CPU loops call too. Each direction is three launches, as the CPU's two passes plus the
// per-channel step between them:
//   1. partial sums: a block of 32 channels x 8 row lanes sums one chunk of 128 rows in float
//      (threads of a warp read 32 consecutive channels of a row, so loads coalesce); the 8 lanes
//      are added in a fixed order, one partial per chunk and channel;
//   2. per channel: one block adds that channel's chunk partials in double (a fixed tree, so
//      results do not change from run to run) and applies the channel formulas;
//   3. elementwise: y = act(scale x + shift), or dx (+)= k_dy dz + k_x (x - mean) + k_0.
// Forward centres its sums on row 0 of x, as the CPU, so the variance does not cancel.
#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/batchnorm.h"
#include "kernels/batchnorm_math.h"

namespace ft {
namespace {

constexpr int kChannelsPerBlock = 32;
constexpr int kRowLanes = 8;
constexpr int kChannelThreads = 256;        // threads of a per-channel block
constexpr int64_t kMaxChunkBlocks = 65535;  // gridDim.y limit; more chunks loop

// partials[chunk][0][c] = sum w, partials[chunk][1][c] = sum w d over the chunk's rows, with
// d = x - centre[c] and w = d, dy (kWeighted) or dy masked by y > 0 (kMasked).
template <bool kWeighted, bool kMasked>
__global__ void partial_sums_kernel(float* partials, const float* x, const float* dy,
                                    const float* y, const float* centre, int64_t rows,
                                    int channels) {
  __shared__ float first_lanes[kRowLanes][kChannelsPerBlock];
  __shared__ float second_lanes[kRowLanes][kChannelsPerBlock];
  const int c = blockIdx.x * kChannelsPerBlock + threadIdx.x;
  const int64_t chunks = (rows + kBatchNormCudaRowsPerChunk - 1) / kBatchNormCudaRowsPerChunk;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t begin = chunk * kBatchNormCudaRowsPerChunk;
    const int64_t end =
        begin + kBatchNormCudaRowsPerChunk < rows ? begin + kBatchNormCudaRowsPerChunk : rows;
    float first = 0.0f, second = 0.0f;
    if (c < channels) {
      const float k = centre[c];
      for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
        const int64_t at = r * channels + c;
        const float d = x[at] - k;
        float w = d;
        if (kWeighted) w = kMasked ? batchnorm_relu_masked(dy[at], y[at], 0.0f) : dy[at];
        first += w;
        second += w * d;
      }
    }
    first_lanes[threadIdx.y][threadIdx.x] = first;
    second_lanes[threadIdx.y][threadIdx.x] = second;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
      float first_sum = 0.0f, second_sum = 0.0f;
      for (int lane = 0; lane < kRowLanes; ++lane) {
        first_sum += first_lanes[lane][threadIdx.x];
        second_sum += second_lanes[lane][threadIdx.x];
      }
      float* out = partials + chunk * 2 * channels;
      out[c] = first_sum;
      out[channels + c] = second_sum;
    }
    __syncthreads();  // the lanes are rewritten by the next chunk
  }
}

// Channel blockIdx.x's totals over every chunk, in double: thread t adds chunks t, t + 256, ...,
// then a tree halves the 256 partial totals. Thread 0 returns the result.
__device__ void channel_totals(const float* partials, int64_t chunks, int channels, double* first,
                               double* second) {
  __shared__ double first_threads[kChannelThreads];
  __shared__ double second_threads[kChannelThreads];
  const int c = blockIdx.x;
  double first_sum = 0.0, second_sum = 0.0;
  for (int64_t chunk = threadIdx.x; chunk < chunks; chunk += kChannelThreads) {
    first_sum += partials[chunk * 2 * channels + c];
    second_sum += partials[chunk * 2 * channels + channels + c];
  }
  first_threads[threadIdx.x] = first_sum;
  second_threads[threadIdx.x] = second_sum;
  __syncthreads();
  for (int half = kChannelThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      first_threads[threadIdx.x] += first_threads[threadIdx.x + half];
      second_threads[threadIdx.x] += second_threads[threadIdx.x + half];
    }
    __syncthreads();
  }
  *first = first_threads[0];
  *second = second_threads[0];
}

// Batch statistics, the running statistics' update and coefficients {scale, shift} [2][C].
__global__ void forward_statistics_kernel(float* saved_mean, float* saved_invstd,
                                          float* running_mean, float* running_var,
                                          float* coefficients, const float* partials,
                                          const float* x, const float* gamma, const float* beta,
                                          int64_t chunks, int64_t rows, int channels,
                                          float momentum, float eps) {
  double sum = 0.0, squares = 0.0;
  channel_totals(partials, chunks, channels, &sum, &squares);
  if (threadIdx.x != 0) return;
  const int c = blockIdx.x;
  const double count = static_cast<double>(rows);
  const BatchNormChannelStatistics stats =
      batchnorm_channel_statistics(sum, squares, x[c], count, eps);
  saved_mean[c] = stats.mean;
  saved_invstd[c] = stats.invstd;
  running_mean[c] = batchnorm_running_mean(running_mean[c], momentum, stats.mean);
  running_var[c] = batchnorm_running_var(running_var[c], momentum, stats.batch_var, count);
  const float scale = gamma[c] * stats.invstd;
  coefficients[c] = scale;
  coefficients[channels + c] = beta[c] - stats.mean * scale;
}

// dgamma, dbeta += and the input-gradient coefficients {k_dy, k_x, k_0} [3][C].
__global__ void backward_coefficients_kernel(float* dgamma, float* dbeta, float* coefficients,
                                             const float* partials, const float* gamma,
                                             const float* saved_invstd, int64_t chunks,
                                             int64_t rows, int channels) {
  double sum_dz = 0.0, sum_dz_centred = 0.0;
  channel_totals(partials, chunks, channels, &sum_dz, &sum_dz_centred);
  if (threadIdx.x != 0) return;
  const int c = blockIdx.x;
  const BatchNormBackwardCoefficients k = batchnorm_backward_coefficients(
      sum_dz, sum_dz_centred, gamma[c], saved_invstd[c], static_cast<double>(rows));
  dbeta[c] += k.dbeta;
  dgamma[c] += k.dgamma;
  coefficients[c] = k.k_dy;
  coefficients[channels + c] = k.k_x;
  coefficients[2 * channels + c] = k.k_0;
}

template <bool kRelu>
__global__ void scale_shift_kernel(float* y, const float* x, const float* scale, const float* shift,
                                   int64_t numel, int channels) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int c = static_cast<int>(i % channels);
    y[i] = batchnorm_scale_shift<kRelu>(scale[c], x[i], shift[c], 0.0f);
  }
}

// Inference: the per-channel scale and shift are recomputed per element (a sqrt and two
// multiply-adds), cheaper than a launch to tabulate them.
template <bool kRelu>
__global__ void inference_kernel(float* y, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, int64_t numel,
                                 int channels, float eps) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int c = static_cast<int>(i % channels);
    const float scale = batchnorm_inference_scale(gamma[c], running_var[c], eps);
    const float shift = beta[c] - running_mean[c] * scale;
    y[i] = batchnorm_scale_shift<kRelu>(scale, x[i], shift, 0.0f);
  }
}

template <bool kMasked, bool kFresh>
__global__ void input_gradient_kernel(float* dx, const float* dy, const float* y, const float* x,
                                      const float* mean, const float* coefficients, int64_t numel,
                                      int channels) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int c = static_cast<int>(i % channels);
    const float dz = kMasked ? batchnorm_relu_masked(dy[i], y[i], 0.0f) : dy[i];
    const float gradient = batchnorm_input_gradient(coefficients[c], dz, coefficients[channels + c],
                                                    x[i] - mean[c], coefficients[2 * channels + c]);
    dx[i] = kFresh ? gradient : dx[i] + gradient;
  }
}

int64_t chunk_count(int64_t rows) {
  return (rows + kBatchNormCudaRowsPerChunk - 1) / kBatchNormCudaRowsPerChunk;
}

dim3 partial_sums_grid(int64_t rows, int channels) {
  return dim3(static_cast<unsigned int>((channels + kChannelsPerBlock - 1) / kChannelsPerBlock),
              static_cast<unsigned int>(std::min(chunk_count(rows), kMaxChunkBlocks)));
}

const dim3 kPartialSumsBlock(kChannelsPerBlock, kRowLanes);

}  // namespace

void batchnorm_train_statistics_cuda(float* saved_mean, float* saved_invstd, float* running_mean,
                                     float* running_var, float* partials, float* coefficients,
                                     const float* x, const float* gamma, const float* beta,
                                     int64_t rows, int channels, float momentum, float eps,
                                     CudaStream stream) {
  partial_sums_kernel<false, false>
      <<<partial_sums_grid(rows, channels), kPartialSumsBlock, 0, stream>>>(
          partials, x, nullptr, nullptr, x, rows, channels);
  FT_CUDA_CHECK_LAUNCH();
  forward_statistics_kernel<<<channels, kChannelThreads, 0, stream>>>(
      saved_mean, saved_invstd, running_mean, running_var, coefficients, partials, x, gamma, beta,
      chunk_count(rows), rows, channels, momentum, eps);
  FT_CUDA_CHECK_LAUNCH();
}

void batchnorm_forward_train_cuda(float* y, float* saved_mean, float* saved_invstd,
                                  float* running_mean, float* running_var, float* partials,
                                  float* coefficients, const float* x, const float* gamma,
                                  const float* beta, int64_t rows, int channels, float momentum,
                                  float eps, BatchNormActivation activation, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  batchnorm_train_statistics_cuda(saved_mean, saved_invstd, running_mean, running_var, partials,
                                  coefficients, x, gamma, beta, rows, channels, momentum, eps,
                                  stream);
  const int64_t numel = rows * channels;
  const auto scale_shift = activation == BatchNormActivation::kRelu ? scale_shift_kernel<true>
                                                                    : scale_shift_kernel<false>;
  scale_shift<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      y, x, coefficients, coefficients + channels, numel, channels);
  FT_CUDA_CHECK_LAUNCH();
}

void batchnorm_backward_statistics_cuda(float* dgamma, float* dbeta, float* partials,
                                        float* coefficients, const float* dy,
                                        const float* relu_output, const float* x,
                                        const float* gamma, const float* saved_mean,
                                        const float* saved_invstd, int64_t rows, int channels,
                                        CudaStream stream) {
  // One launch site per kernel, so each FT_CUDA_CHECK_LAUNCH counts one launch; the
  // instantiations take the same arguments, relu_output being null exactly when unmasked.
  const auto partial_sums =
      relu_output != nullptr ? partial_sums_kernel<true, true> : partial_sums_kernel<true, false>;
  partial_sums<<<partial_sums_grid(rows, channels), kPartialSumsBlock, 0, stream>>>(
      partials, x, dy, relu_output, saved_mean, rows, channels);
  FT_CUDA_CHECK_LAUNCH();
  backward_coefficients_kernel<<<channels, kChannelThreads, 0, stream>>>(
      dgamma, dbeta, coefficients, partials, gamma, saved_invstd, chunk_count(rows), rows,
      channels);
  FT_CUDA_CHECK_LAUNCH();
}

void batchnorm_backward_cuda(float* dx, float* dgamma, float* dbeta, float* partials,
                             float* coefficients, const float* dy, const float* relu_output,
                             const float* x, const float* gamma, const float* saved_mean,
                             const float* saved_invstd, int64_t rows, int channels, bool dx_fresh,
                             CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  const bool masked = relu_output != nullptr;
  batchnorm_backward_statistics_cuda(dgamma, dbeta, partials, coefficients, dy, relu_output, x,
                                     gamma, saved_mean, saved_invstd, rows, channels, stream);
  const int64_t numel = rows * channels;
  const auto input_gradient =
      masked
          ? (dx_fresh ? input_gradient_kernel<true, true> : input_gradient_kernel<true, false>)
          : (dx_fresh ? input_gradient_kernel<false, true> : input_gradient_kernel<false, false>);
  input_gradient<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      dx, dy, relu_output, x, saved_mean, coefficients, numel, channels);
  FT_CUDA_CHECK_LAUNCH();
}

void batchnorm_forward_inference_cuda(float* y, const float* x, const float* gamma,
                                      const float* beta, const float* running_mean,
                                      const float* running_var, int64_t rows, int channels,
                                      float eps, BatchNormActivation activation,
                                      CudaStream stream) {
  const int64_t numel = rows * channels;
  if (numel <= 0) return;
  const auto inference =
      activation == BatchNormActivation::kRelu ? inference_kernel<true> : inference_kernel<false>;
  inference<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      y, x, gamma, beta, running_mean, running_var, numel, channels, eps);
  FT_CUDA_CHECK_LAUNCH();
}

void batchnorm_forward_train_cuda(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                                  BatchNormActivation activation, CudaStream stream) {
  batchnorm_forward_train_cuda(y, b.saved_mean, b.saved_invstd, b.running_mean, b.running_var,
                               b.partials, b.coefficients, b.x, b.gamma, b.beta, rows, channels,
                               b.momentum, b.eps, activation, stream);
}

void batchnorm_backward_cuda(const float* dy, const float* relu_output, const BatchNormBranch& b,
                             int64_t rows, int channels, CudaStream stream) {
  batchnorm_backward_cuda(b.dx, b.dgamma, b.dbeta, b.partials, b.coefficients, dy, relu_output, b.x,
                          b.gamma, b.saved_mean, b.saved_invstd, rows, channels, b.dx_fresh,
                          stream);
}

void batchnorm_forward_inference_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                      int channels, BatchNormActivation activation,
                                      CudaStream stream) {
  batchnorm_forward_inference_cuda(y, b.x, b.gamma, b.beta, b.running_mean, b.running_var, rows,
                                   channels, b.eps, activation, stream);
}

}  // namespace ft
