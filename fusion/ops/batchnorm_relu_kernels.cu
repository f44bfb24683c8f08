// BatchNorm's ReLU variants on CUDA: plain BatchNorm's kernels (kernels/batchnorm_cuda_loops.cuh)
// with a ReLU in the elementwise pass (ReluOutput) or dy masked by the ReLU's output y > 0 in
// backward (ReluOutputDz), each with the expressions the CPU variants
// (batchnorm_relu_kernels.cpp) and ReluOp evaluate (batchnorm_relu_math.h).
#include "core/cuda/cuda_check.h"
#include "fusion/ops/batchnorm_relu_kernels.h"
#include "fusion/ops/batchnorm_relu_math.h"
#include "kernels/batchnorm_cuda_loops.cuh"

namespace ft {
namespace {

// The elementwise pass of the ReLU variants: y = max(scale x + shift, 0).
struct ReluOutput {
  FT_HD static float apply(float scale, float x, float shift) {
    return batchnorm_scale_shift_relu(scale, x, shift, 0.0f);
  }
};

// dz = dy where the ReLU passed its input, y > 0.
struct ReluOutputDz {
  const float* y;
  FT_HD float operator()(const float* dy, int64_t at) const {
    return batchnorm_relu_masked(dy[at], y[at], 0.0f);
  }
};

}  // namespace

void batchnorm_relu_forward_train_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                       int channels, CudaStream stream) {
  batchnorm_cuda_loops::forward_train<ReluOutput>(
      y, b.saved_mean, b.saved_invstd, b.running_mean, b.running_var, b.partials, b.coefficients,
      b.x, b.gamma, b.beta, rows, channels, b.momentum, b.eps, stream);
}

void batchnorm_relu_backward_cuda(const float* dy, const float* relu_output,
                                  const BatchNormBranch& b, int64_t rows, int channels,
                                  CudaStream stream) {
  batchnorm_cuda_loops::backward(b.dx, b.dgamma, b.dbeta, b.partials, b.coefficients, dy,
                                 ReluOutputDz{relu_output}, b.x, b.gamma, b.saved_mean,
                                 b.saved_invstd, rows, channels, b.dx_fresh, stream);
}

void batchnorm_relu_backward_statistics_cuda(float* dgamma, float* dbeta, float* partials,
                                             float* coefficients, const float* dy,
                                             const float* relu_output, const float* x,
                                             const float* gamma, const float* saved_mean,
                                             const float* saved_invstd, int64_t rows, int channels,
                                             CudaStream stream) {
  batchnorm_cuda_loops::backward_statistics(dgamma, dbeta, partials, coefficients, dy,
                                            ReluOutputDz{relu_output}, x, gamma, saved_mean,
                                            saved_invstd, rows, channels, stream);
}

void batchnorm_relu_forward_inference_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                           int channels, CudaStream stream) {
  batchnorm_cuda_loops::forward_inference<ReluOutput>(y, b.x, b.gamma, b.beta, b.running_mean,
                                                      b.running_var, rows, channels, b.eps, stream);
}

}  // namespace ft
