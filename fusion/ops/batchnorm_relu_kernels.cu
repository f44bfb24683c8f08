// BatchNorm's ReLU variants on CUDA: plain BatchNorm's kernels (kernels/batchnorm_cuda_loops.cuh)
// with a ReLU in the elementwise pass (ReluOutput) or dy masked by the ReLU's output y > 0 in
// backward (ReluOutputDz; y fp32, or bf16 where the op writes a convolution's bf16 operand), each
// with the expressions the CPU variants
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

// dz = dy where the ReLU passed its input, y > 0; Y is float, or bf16_bits for a y written in
// bf16 (rounding keeps every sign, so the mask is the fp32 one).
template <typename Y>
struct ReluOutputDz {
  const Y* y;
  FT_HD static float widen(float value) { return value; }
  FT_HD static float widen(bf16_bits value) { return bf16_to_float(value); }
  FT_HD float operator()(const float* dy, int64_t at) const {
    return batchnorm_relu_masked(dy[at], widen(y[at]), 0.0f);
  }
};

template <typename Y>
void relu_backward(const float* dy, const Y* relu_output, const BatchNormBranch& b, int64_t rows,
                   int channels, CudaStream stream) {
  batchnorm_cuda_loops::backward(b.dx, b.dgamma, b.dbeta, b.partials, b.coefficients, dy,
                                 ReluOutputDz<Y>{relu_output}, b.x, b.gamma, b.saved_mean,
                                 b.saved_invstd, rows, channels, b.dx_fresh, stream);
}

template <typename Y>
void relu_forward_train(Y* y, const BatchNormBranch& b, int64_t rows, int channels,
                        CudaStream stream) {
  batchnorm_cuda_loops::forward_train<ReluOutput>(
      y, b.saved_mean, b.saved_invstd, b.running_mean, b.running_var, b.partials, b.coefficients,
      b.x, b.gamma, b.beta, rows, channels, b.momentum, b.eps, stream);
}

}  // namespace

void batchnorm_relu_forward_train_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                       int channels, CudaStream stream) {
  relu_forward_train(y, b, rows, channels, stream);
}

void batchnorm_relu_forward_train_cuda(bf16_bits* y, const BatchNormBranch& b, int64_t rows,
                                       int channels, CudaStream stream) {
  relu_forward_train(y, b, rows, channels, stream);
}

void batchnorm_relu_backward_cuda(const float* dy, const float* relu_output,
                                  const BatchNormBranch& b, int64_t rows, int channels,
                                  CudaStream stream) {
  relu_backward(dy, relu_output, b, rows, channels, stream);
}

void batchnorm_relu_backward_cuda(const float* dy, const bf16_bits* relu_output,
                                  const BatchNormBranch& b, int64_t rows, int channels,
                                  CudaStream stream) {
  relu_backward(dy, relu_output, b, rows, channels, stream);
}

void batchnorm_relu_backward_statistics_cuda(float* dgamma, float* dbeta, float* partials,
                                             float* coefficients, const float* dy,
                                             const float* relu_output, const float* x,
                                             const float* gamma, const float* saved_mean,
                                             const float* saved_invstd, int64_t rows, int channels,
                                             CudaStream stream) {
  batchnorm_cuda_loops::backward_statistics(dgamma, dbeta, partials, coefficients, dy,
                                            ReluOutputDz<float>{relu_output}, x, gamma, saved_mean,
                                            saved_invstd, rows, channels, stream);
}

void batchnorm_relu_forward_inference_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                           int channels, CudaStream stream) {
  batchnorm_cuda_loops::forward_inference<ReluOutput>(y, b.x, b.gamma, b.beta, b.running_mean,
                                                      b.running_var, rows, channels, b.eps, stream);
}

}  // namespace ft
