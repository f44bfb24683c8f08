// BatchNorm's ReLU variants on the CPU: plain BatchNorm's loops (kernels/batchnorm_loops.h) with
// a ReLU in the elementwise pass (BatchNormReluOutput) or dy masked in backward (the Dz policies
// below). Each policy evaluates the expressions of BatchNorm followed by ReluOp
// (batchnorm_relu_math.h), and this file compiles with -ffp-contract=off as batchnorm.cpp does,
// so BatchNormReluOp agrees with the unfused pair bit for bit.
#include "fusion/ops/batchnorm_relu_kernels.h"

#include <cstring>

#include "core/check.h"
#include "fusion/ops/batchnorm_relu_math.h"
#include "kernels/batchnorm_loops.h"

namespace ft {
namespace {

// The elementwise pass of the ReLU variants: y = max(scale x + shift, 0).
struct BatchNormReluOutput {
  template <typename V>
  static V apply(V scale, V x, V shift) {
    return batchnorm_scale_shift_relu(scale, x, shift, V{});
  }
};

// dz = dy where the ReLU passed its input, y > 0, read from the ReLU's output (kReluOutput).
// V is Lanes (channels c..c+7 of element `at`) or float.
struct ReluOutputDz {
  const float* y;
  template <typename V>
  V operator()(V dy, V /*x*/, int64_t at, int /*c*/) const {
    V zero = {};
    V y_at;
    std::memcpy(&y_at, y + at, sizeof y_at);
    return batchnorm_relu_masked(dy, y_at, zero);
  }
};

// dz = dy where z = scale x + shift > 0, recomputed with forward's expression from forward's
// {scale, shift} [C] each (kRecomputed): the same mask as y > 0, bit for bit, without reading y.
struct RecomputedDz {
  const float* scale;
  const float* shift;
  template <typename V>
  V operator()(V dy, V x, int64_t /*at*/, int c) const {
    V zero = {};
    V scale_c, shift_c;
    std::memcpy(&scale_c, scale + c, sizeof scale_c);
    std::memcpy(&shift_c, shift + c, sizeof shift_c);
    return batchnorm_relu_masked(dy, batchnorm_scale_shift(scale_c, x, shift_c), zero);
  }
};

// Forward's {scale, shift} recomputed into scratch.mask_coefficients, for RecomputedDz.
RecomputedDz recomputed_dz(const float* gamma, const float* beta, const float* saved_mean,
                           const float* saved_invstd, int channels, BatchNormScratch& scratch) {
  FT_CHECK(beta != nullptr, "batchnorm: kRecomputed needs beta");
  scratch.mask_coefficients.resize(2 * static_cast<size_t>(channels));
  float* scale = scratch.mask_coefficients.data();
  normalisation_coefficients(scale, scale + channels, gamma, beta, saved_mean, saved_invstd,
                             channels);
  return RecomputedDz{scale, scale + channels};
}

ReluOutputDz relu_output_dz(const float* relu_output) {
  FT_CHECK(relu_output != nullptr, "batchnorm: kReluOutput needs the ReLU's output");
  return ReluOutputDz{relu_output};
}

template <typename Out>
void relu_forward_train(Out* y, const BatchNormBranch& b, int64_t rows, int channels,
                        BatchNormScratch& scratch) {
  batchnorm_loops::forward_train<BatchNormReluOutput>(
      y, b.saved_mean, b.saved_invstd, b.running_mean, b.running_var, b.x, b.gamma, b.beta, rows,
      channels, b.momentum, b.eps, scratch);
}

}  // namespace

void batchnorm_relu_forward_train(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                                  BatchNormScratch& scratch) {
  relu_forward_train(y, b, rows, channels, scratch);
}

void batchnorm_relu_forward_train(bf16_bits* y, const BatchNormBranch& b, int64_t rows,
                                  int channels, BatchNormScratch& scratch) {
  relu_forward_train(y, b, rows, channels, scratch);
}

// With a ReLU after the normalisation, y = relu(z) and z = gamma x_hat + beta, the chain rule
// gives dz = dy * [z > 0] = dy * [y > 0]; the rest is BatchNorm's backward with dz in place of its
// output gradient (derived in kernels/batchnorm_loops.h). BatchNormReluOp recomputes z from x,
// which both passes read anyway, rather than reading y: 2 of the 7 floats per element its
// backward would otherwise stream.
void batchnorm_relu_backward(const float* dy, BatchNormMask mask, const float* relu_output,
                             const BatchNormBranch& b, int64_t rows, int channels,
                             BatchNormScratch& scratch) {
  if (mask == BatchNormMask::kReluOutput) {
    batchnorm_loops::backward(b.dx, b.dgamma, b.dbeta, dy, relu_output_dz(relu_output), b.x,
                              b.gamma, b.saved_mean, b.saved_invstd, rows, channels, b.dx_fresh,
                              scratch);
    return;
  }
  const RecomputedDz dz_of =
      recomputed_dz(b.gamma, b.beta, b.saved_mean, b.saved_invstd, channels, scratch);
  batchnorm_loops::backward(b.dx, b.dgamma, b.dbeta, dy, dz_of, b.x, b.gamma, b.saved_mean,
                            b.saved_invstd, rows, channels, b.dx_fresh, scratch);
}

void batchnorm_relu_backward_statistics(float* dgamma, float* dbeta, const float* dy,
                                        BatchNormMask mask, const float* relu_output,
                                        const float* x, const float* gamma, const float* beta,
                                        const float* saved_mean, const float* saved_invstd,
                                        int64_t rows, int channels, BatchNormScratch& scratch) {
  if (mask == BatchNormMask::kReluOutput) {
    batchnorm_loops::backward_statistics(dgamma, dbeta, dy, relu_output_dz(relu_output), x, gamma,
                                         saved_mean, saved_invstd, rows, channels, scratch);
    return;
  }
  const RecomputedDz dz_of =
      recomputed_dz(gamma, beta, saved_mean, saved_invstd, channels, scratch);
  batchnorm_loops::backward_statistics(dgamma, dbeta, dy, dz_of, x, gamma, saved_mean, saved_invstd,
                                       rows, channels, scratch);
}

void batchnorm_relu_forward_inference(float* y, const BatchNormBranch& b, int64_t rows,
                                      int channels, BatchNormScratch& scratch) {
  batchnorm_loops::forward_inference<BatchNormReluOutput>(
      y, b.x, b.gamma, b.beta, b.running_mean, b.running_var, rows, channels, b.eps, scratch);
}

}  // namespace ft
