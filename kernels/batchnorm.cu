// BatchNorm on CUDA over NHWC [rows, C], with the helpers of kernels/batchnorm_math.h that the
// CPU loops call too. Each direction is three launches, as the CPU's two passes plus the
// per-channel step between them:
//   1. partial sums: a block of 32 channels x 8 row lanes sums one chunk of 128 rows in float
//      (threads of a warp read 32 consecutive channels of a row, so loads coalesce); the 8 lanes
//      are added in a fixed order, one partial per chunk and channel;
//   2. per channel: one block adds that channel's chunk partials in double (a fixed tree, so
//      results do not change from run to run) and applies the channel formulas;
//   3. elementwise: y = scale x + shift, or dx (+)= k_dy dz + k_x (x - mean) + k_0.
// Passes 1 and 3 are in batchnorm_cuda_loops.cuh, generic over the elementwise output and dz,
// so fusion/'s ReLU variants (fusion/ops/batchnorm_relu_kernels.cu) run them too; this file
// holds pass 2 and plain BatchNorm's launchers.
// Forward centres its sums on row 0 of x, as the CPU, so the variance does not cancel.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/batchnorm.h"
#include "kernels/batchnorm_cuda_loops.cuh"
#include "kernels/batchnorm_math.h"

namespace ft {
namespace {

using batchnorm_cuda_loops::chunk_count;
using batchnorm_cuda_loops::PlainDz;
using batchnorm_cuda_loops::PlainOutput;

constexpr int kChannelThreads = 256;  // threads of a per-channel block

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

}  // namespace

void batchnorm_train_statistics_cuda(float* saved_mean, float* saved_invstd, float* running_mean,
                                     float* running_var, float* partials, float* coefficients,
                                     const float* x, const float* gamma, const float* beta,
                                     int64_t rows, int channels, float momentum, float eps,
                                     CudaStream stream) {
  batchnorm_cuda_loops::partial_sums<false>(partials, x, nullptr, PlainDz{}, x, rows, channels,
                                            stream);
  forward_statistics_kernel<<<channels, kChannelThreads, 0, stream>>>(
      saved_mean, saved_invstd, running_mean, running_var, coefficients, partials, x, gamma, beta,
      chunk_count(rows), rows, channels, momentum, eps);
  FT_CUDA_CHECK_LAUNCH();
}

void batchnorm_backward_coefficients_cuda(float* dgamma, float* dbeta, float* coefficients,
                                          const float* partials, const float* gamma,
                                          const float* saved_invstd, int64_t rows, int channels,
                                          CudaStream stream) {
  backward_coefficients_kernel<<<channels, kChannelThreads, 0, stream>>>(
      dgamma, dbeta, coefficients, partials, gamma, saved_invstd, chunk_count(rows), rows,
      channels);
  FT_CUDA_CHECK_LAUNCH();
}

void batchnorm_forward_train_cuda(float* y, float* saved_mean, float* saved_invstd,
                                  float* running_mean, float* running_var, float* partials,
                                  float* coefficients, const float* x, const float* gamma,
                                  const float* beta, int64_t rows, int channels, float momentum,
                                  float eps, CudaStream stream) {
  batchnorm_cuda_loops::forward_train<PlainOutput>(y, saved_mean, saved_invstd, running_mean,
                                                   running_var, partials, coefficients, x, gamma,
                                                   beta, rows, channels, momentum, eps, stream);
}

void batchnorm_backward_cuda(float* dx, float* dgamma, float* dbeta, float* partials,
                             float* coefficients, const float* dy, const float* x,
                             const float* gamma, const float* saved_mean, const float* saved_invstd,
                             int64_t rows, int channels, bool dx_fresh, CudaStream stream) {
  batchnorm_cuda_loops::backward(dx, dgamma, dbeta, partials, coefficients, dy, PlainDz{}, x, gamma,
                                 saved_mean, saved_invstd, rows, channels, dx_fresh, stream);
}

void batchnorm_forward_inference_cuda(float* y, const float* x, const float* gamma,
                                      const float* beta, const float* running_mean,
                                      const float* running_var, int64_t rows, int channels,
                                      float eps, CudaStream stream) {
  batchnorm_cuda_loops::forward_inference<PlainOutput>(y, x, gamma, beta, running_mean, running_var,
                                                       rows, channels, eps, stream);
}

void batchnorm_forward_train_cuda(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                                  CudaStream stream) {
  batchnorm_forward_train_cuda(y, b.saved_mean, b.saved_invstd, b.running_mean, b.running_var,
                               b.partials, b.coefficients, b.x, b.gamma, b.beta, rows, channels,
                               b.momentum, b.eps, stream);
}

void batchnorm_backward_cuda(const float* dy, const BatchNormBranch& b, int64_t rows, int channels,
                             CudaStream stream) {
  batchnorm_backward_cuda(b.dx, b.dgamma, b.dbeta, b.partials, b.coefficients, dy, b.x, b.gamma,
                          b.saved_mean, b.saved_invstd, rows, channels, b.dx_fresh, stream);
}

void batchnorm_forward_inference_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                      int channels, CudaStream stream) {
  batchnorm_forward_inference_cuda(y, b.x, b.gamma, b.beta, b.running_mean, b.running_var, rows,
                                   channels, b.eps, stream);
}

}  // namespace ft
