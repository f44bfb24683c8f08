// Plain BatchNorm on the CPU: the loops of batchnorm_loops.h with BatchNorm's own elementwise
// pass (y = scale x + shift) and dz = dy; fusion/ops/batchnorm_relu_kernels.cpp runs the same
// loops with a ReLU. The forward statistics (batchnorm_train_statistics) and forward's
// normalisation coefficients are here too, since every variant shares them.
#include "kernels/batchnorm.h"

#include "kernels/batchnorm_loops.h"
#include "kernels/batchnorm_math.h"

namespace ft {

// z = scale x + shift with scale = gamma invstd and shift = beta - mean scale: forward's
// normalisation, and backward's recomputed ReLU mask, from one expression.
void normalisation_coefficients(float* scale, float* shift, const float* gamma, const float* beta,
                                const float* mean, const float* invstd, int channels) {
  for (int c = 0; c < channels; ++c) scale[c] = gamma[c] * invstd[c];
  for (int c = 0; c < channels; ++c) shift[c] = beta[c] - mean[c] * scale[c];
}

void batchnorm_train_statistics(float* saved_mean, float* saved_invstd, float* running_mean,
                                float* running_var, const float* x, const float* gamma,
                                const float* beta, int64_t rows, int channels, float momentum,
                                float eps, BatchNormScratch& scratch) {
  scratch.sums.resize(2 * static_cast<size_t>(channels));
  scratch.coefficients.resize(3 * static_cast<size_t>(channels));
  float* scale = scratch.coefficients.data();
  float* shift = scale + channels;
  // One pass of sums of (x - k) and (x - k)^2 with k = the channel's first value: the variance
  // S2/M - (S1/M)^2 then cancels only (mean - k)^2, which is small when k is a typical value,
  // where E[x^2] - E[x]^2 loses everything once |mean| >> std.
  const float* offset = x;  // row 0
  double* sum = scratch.sums.data();
  double* squares = sum + channels;
  batchnorm_loops::sum_centred<false>(x, nullptr, BatchNormPlainDz{}, offset, rows, channels,
                                      scratch.chunk_sums, sum, squares);
  const double count = static_cast<double>(rows);
  for (int c = 0; c < channels; ++c) {
    const BatchNormChannelStatistics stats =
        batchnorm_channel_statistics(sum[c], squares[c], offset[c], count, eps);
    saved_mean[c] = stats.mean;
    saved_invstd[c] = stats.invstd;
    running_mean[c] = batchnorm_running_mean(running_mean[c], momentum, stats.mean);
    running_var[c] = batchnorm_running_var(running_var[c], momentum, stats.batch_var, count);
  }
  normalisation_coefficients(scale, shift, gamma, beta, saved_mean, saved_invstd, channels);
}

void batchnorm_forward_train(float* y, float* saved_mean, float* saved_invstd, float* running_mean,
                             float* running_var, const float* x, const float* gamma,
                             const float* beta, int64_t rows, int channels, float momentum,
                             float eps, BatchNormScratch& scratch) {
  batchnorm_loops::forward_train<BatchNormPlainOutput>(y, saved_mean, saved_invstd, running_mean,
                                                       running_var, x, gamma, beta, rows, channels,
                                                       momentum, eps, scratch);
}

void batchnorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* gamma, const float* saved_mean, const float* saved_invstd,
                        int64_t rows, int channels, bool dx_fresh, BatchNormScratch& scratch) {
  batchnorm_loops::backward(dx, dgamma, dbeta, dy, BatchNormPlainDz{}, x, gamma, saved_mean,
                            saved_invstd, rows, channels, dx_fresh, scratch);
}

void batchnorm_forward_inference(float* y, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, int64_t rows,
                                 int channels, float eps, BatchNormScratch& scratch) {
  batchnorm_loops::forward_inference<BatchNormPlainOutput>(
      y, x, gamma, beta, running_mean, running_var, rows, channels, eps, scratch);
}

}  // namespace ft
