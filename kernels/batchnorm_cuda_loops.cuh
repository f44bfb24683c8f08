// BatchNorm's CUDA kernels over NHWC [rows, C] that differ between plain BatchNorm
// (kernels/batchnorm.cu) and fusion/'s ReLU variants (fusion/ops/batchnorm_relu_kernels.cu),
// generic over the same two places as the CPU loops (batchnorm_loops.h):
//   Output, what the elementwise pass stores: FT_HD static float apply(float scale, float x,
//     float shift) (PlainOutput: z = scale x + shift);
//   Dz, where backward's dz comes from: FT_HD float operator()(const float* dy, int64_t at) const
//     (PlainDz: dz = dy[at]).
// The elementwise pass stores into float, or into bf16 (rounded once from the fp32 value, for
// the fused ops that write a convolution's bf16 operand: train.precision bf16).
// Of a direction's three launches (see batchnorm.cu), the two passes over the activations are
// here; the per-channel step between them does not differ and stays in batchnorm.cu
// (batchnorm_train_statistics_cuda, batchnorm_backward_coefficients_cuda).
// Thread safety: the launchers enqueue on the caller's stream.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/hd.h"
#include "core/math/bf16_math.h"
#include "kernels/batchnorm.h"
#include "kernels/batchnorm_math.h"

namespace ft {
namespace batchnorm_cuda_loops {

constexpr int kChannelsPerBlock = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kMaxChunkBlocks = 65535;  // gridDim.y limit; more chunks loop

// Plain BatchNorm's elementwise pass: y = z = scale x + shift.
struct PlainOutput {
  FT_HD static float apply(float scale, float x, float shift) {
    return batchnorm_scale_shift(scale, x, shift);
  }
};

// Plain BatchNorm's backward: dz = dy.
struct PlainDz {
  FT_HD float operator()(const float* dy, int64_t at) const { return dy[at]; }
};

inline int64_t chunk_count(int64_t rows) {
  return (rows + kBatchNormCudaRowsPerChunk - 1) / kBatchNormCudaRowsPerChunk;
}

// partials[chunk][0][c] = sum w, partials[chunk][1][c] = sum w d over the chunk's rows, with
// d = x - centre[c] and w = d, or w = dz (kWeighted; dz from dy by dz_of).
template <bool kWeighted, typename Dz>
__global__ void partial_sums_kernel(float* partials, const float* x, const float* dy, Dz dz_of,
                                    const float* centre, int64_t rows, int channels) {
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
        if (kWeighted) w = dz_of(dy, at);
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

template <typename Output, typename Y>
__global__ void scale_shift_kernel(Y* y, const float* x, const float* scale, const float* shift,
                                   int64_t numel, int channels) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int c = static_cast<int>(i % channels);
    store_value(y + i, Output::apply(scale[c], x[i], shift[c]));
  }
}

// Inference: the per-channel scale and shift are recomputed per element (a sqrt and two
// multiply-adds), cheaper than a launch to tabulate them.
template <typename Output>
__global__ void inference_kernel(float* y, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, int64_t numel,
                                 int channels, float eps) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int c = static_cast<int>(i % channels);
    const float scale = batchnorm_inference_scale(gamma[c], running_var[c], eps);
    const float shift = beta[c] - running_mean[c] * scale;
    y[i] = Output::apply(scale, x[i], shift);
  }
}

template <typename Dz, bool kFresh>
__global__ void input_gradient_kernel(float* dx, const float* dy, Dz dz_of, const float* x,
                                      const float* mean, const float* coefficients, int64_t numel,
                                      int channels) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int c = static_cast<int>(i % channels);
    const float dz = dz_of(dy, i);
    const float gradient = batchnorm_input_gradient(coefficients[c], dz, coefficients[channels + c],
                                                    x[i] - mean[c], coefficients[2 * channels + c]);
    dx[i] = kFresh ? gradient : dx[i] + gradient;
  }
}

// Launches partial_sums_kernel over every chunk of `rows`.
template <bool kWeighted, typename Dz>
void partial_sums(float* partials, const float* x, const float* dy, Dz dz_of, const float* centre,
                  int64_t rows, int channels, CudaStream stream) {
  const dim3 grid(static_cast<unsigned int>((channels + kChannelsPerBlock - 1) / kChannelsPerBlock),
                  static_cast<unsigned int>(std::min(chunk_count(rows), kMaxChunkBlocks)));
  partial_sums_kernel<kWeighted><<<grid, dim3(kChannelsPerBlock, kRowLanes), 0, stream>>>(
      partials, x, dy, dz_of, centre, rows, channels);
  FT_CUDA_CHECK_LAUNCH();
}

// batchnorm_forward_train_cuda with Output's elementwise pass (see kernels/batchnorm.h); Y is
// float or bf16_bits.
template <typename Output, typename Y>
void forward_train(Y* y, float* saved_mean, float* saved_invstd, float* running_mean,
                   float* running_var, float* partials, float* coefficients, const float* x,
                   const float* gamma, const float* beta, int64_t rows, int channels,
                   float momentum, float eps, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  batchnorm_train_statistics_cuda(saved_mean, saved_invstd, running_mean, running_var, partials,
                                  coefficients, x, gamma, beta, rows, channels, momentum, eps,
                                  stream);
  const int64_t numel = rows * channels;
  scale_shift_kernel<Output, Y>
      <<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
          y, x, coefficients, coefficients + channels, numel, channels);
  FT_CUDA_CHECK_LAUNCH();
}

// batchnorm_forward_inference_cuda with Output's elementwise pass (see kernels/batchnorm.h).
template <typename Output>
void forward_inference(float* y, const float* x, const float* gamma, const float* beta,
                       const float* running_mean, const float* running_var, int64_t rows,
                       int channels, float eps, CudaStream stream) {
  const int64_t numel = rows * channels;
  if (numel <= 0) return;
  inference_kernel<Output><<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      y, x, gamma, beta, running_mean, running_var, numel, channels, eps);
  FT_CUDA_CHECK_LAUNCH();
}

// Backward's reduction pass with dz from dy by dz_of, then its per-channel step: dgamma,
// dbeta += and {k_dy, k_x, k_0} [3][C] to `coefficients`.
template <typename Dz>
void backward_statistics(float* dgamma, float* dbeta, float* partials, float* coefficients,
                         const float* dy, Dz dz_of, const float* x, const float* gamma,
                         const float* saved_mean, const float* saved_invstd, int64_t rows,
                         int channels, CudaStream stream) {
  partial_sums<true>(partials, x, dy, dz_of, saved_mean, rows, channels, stream);
  batchnorm_backward_coefficients_cuda(dgamma, dbeta, coefficients, partials, gamma, saved_invstd,
                                       rows, channels, stream);
}

// batchnorm_backward_cuda with dz from dy by dz_of.
template <typename Dz>
void backward(float* dx, float* dgamma, float* dbeta, float* partials, float* coefficients,
              const float* dy, Dz dz_of, const float* x, const float* gamma,
              const float* saved_mean, const float* saved_invstd, int64_t rows, int channels,
              bool dx_fresh, CudaStream stream) {
  if (rows <= 0 || channels <= 0) return;
  backward_statistics(dgamma, dbeta, partials, coefficients, dy, dz_of, x, gamma, saved_mean,
                      saved_invstd, rows, channels, stream);
  const int64_t numel = rows * channels;
  // One launch site, so FT_CUDA_CHECK_LAUNCH counts one launch.
  const auto input_gradient =
      dx_fresh ? input_gradient_kernel<Dz, true> : input_gradient_kernel<Dz, false>;
  input_gradient<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      dx, dy, dz_of, x, saved_mean, coefficients, numel, channels);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace batchnorm_cuda_loops
}  // namespace ft
