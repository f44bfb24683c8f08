// Per-element and per-channel BatchNorm math shared by the CPU loops (kernels/batchnorm_loops.h,
// which call the element helpers on 8-float vectors as well as on floats) and the CUDA kernels
// (batchnorm.cu, batchnorm_cuda_loops.cuh), and by fusion/'s variants of them (whose ReLU math is
// fusion/ops/batchnorm_relu_math.h), so CPU tests cover the GPU's arithmetic. The two only differ
// in how they sum a channel: both sum chunks of rows in float and the chunks in double, the CPU
// with vector accumulators, CUDA with a block tree.
// Thread safety: pure functions.
#pragma once
#include <math.h>

#include "core/hd.h"

namespace ft {

// z = scale * x + shift: the normalisation of the elementwise pass. T is float or a GCC vector of
// floats.
template <typename T>
FT_HD T batchnorm_scale_shift(T scale, T x, T shift) {
  return scale * x + shift;
}

// The input gradient k_dy dz + k_x (x - mean) + k_0 (coefficients from
// batchnorm_backward_coefficients).
template <typename T>
FT_HD T batchnorm_input_gradient(T k_dy, T dz, T k_x, T centred, T k_0) {
  return k_dy * dz + k_x * centred + k_0;
}

// A channel's batch statistics from the double sums of d = x - offset and d^2 over `count` rows:
// the variance S2/M - (S1/M)^2 only cancels (mean - offset)^2, small when offset is one of the
// channel's values.
struct BatchNormChannelStatistics {
  float mean, invstd;
  double batch_var;  // biased
};
FT_HD BatchNormChannelStatistics batchnorm_channel_statistics(double sum, double squares,
                                                              float offset, double count,
                                                              float eps) {
  const double shifted_mean = sum / count;
  const double variance = squares / count - shifted_mean * shifted_mean;
  BatchNormChannelStatistics stats;
  stats.batch_var = variance < 0.0 ? 0.0 : variance;  // std::max(variance, 0.0)
  stats.mean = static_cast<float>(offset + shifted_mean);
  stats.invstd = static_cast<float>(1.0 / sqrt(stats.batch_var + eps));
  return stats;
}

// running <- (1 - momentum) running + momentum batch; the variance goes in unbiased (M / (M-1)).
FT_HD float batchnorm_running_mean(float running, float momentum, float batch_mean) {
  return (1.0f - momentum) * running + momentum * batch_mean;
}
FT_HD float batchnorm_running_var(float running, float momentum, double batch_var, double count) {
  return (1.0f - momentum) * running +
         momentum * static_cast<float>(batch_var * count / (count - 1.0));
}

// Inference: scale = gamma / sqrt(running_var + eps), in float.
FT_HD float batchnorm_inference_scale(float gamma, float running_var, float eps) {
  return gamma / sqrtf(running_var + eps);
}

// Backward of one channel from sum dz and sum dz (x - mean) over `count` rows (derived in
// batchnorm.cpp): the increments of dgamma and dbeta and the input-gradient coefficients.
struct BatchNormBackwardCoefficients {
  float dgamma, dbeta, k_dy, k_x, k_0;
};
FT_HD BatchNormBackwardCoefficients batchnorm_backward_coefficients(double sum_dz,
                                                                    double sum_dz_centred,
                                                                    float gamma, float invstd,
                                                                    double count) {
  const double dgamma = sum_dz_centred * invstd;
  const double scale = static_cast<double>(gamma) * invstd;
  const double x_factor = -scale * invstd * dgamma / count;  // times (x - mean)
  BatchNormBackwardCoefficients k;
  k.dgamma = static_cast<float>(dgamma);
  k.dbeta = static_cast<float>(sum_dz);
  k.k_dy = static_cast<float>(scale);
  k.k_x = static_cast<float>(x_factor);
  k.k_0 = static_cast<float>(-scale * sum_dz / count);
  return k;
}

}  // namespace ft
