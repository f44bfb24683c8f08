// BatchNorm2dOp with OpenMP loops over channels; sums run in double per channel, so statistics of
// large batches keep float precision.
#include "model/ops/batchnorm.h"

#include <cmath>

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

BatchNorm2dOp::BatchNorm2dOp(int batch, int channels, int height, int width, float momentum,
                             float eps)
    : batch_(batch),
      channels_(channels),
      height_(height),
      width_(width),
      momentum_(momentum),
      eps_(eps) {
  FT_CHECK(batch > 0 && channels > 0 && height > 0 && width > 0, "batchnorm2d: bad sizes batch=",
           batch, " channels=", channels, " height=", height, " width=", width);
  FT_CHECK(static_cast<int64_t>(batch) * height * width >= 2,
           "batchnorm2d: needs at least 2 values per channel, got batch=", batch, " height=",
           height, " width=", width);
  FT_CHECK(momentum >= 0.0f && momentum <= 1.0f && eps > 0.0f, "batchnorm2d: momentum ", momentum,
           " must be in [0, 1] and eps ", eps, " positive");
  saved_mean_ = Tensor::zeros({channels});
  saved_invstd_ = Tensor::zeros({channels});
}

void BatchNorm2dOp::forward(Workspace& ws, ParamStore& params) {
  expect_arity(*this, 1, 1, 4);
  const Tensor& x = ws.values[inputs[0]];
  Tensor& y = ws.values[outputs[0]];
  const float* gamma = params[this->params[0]].value.data();
  const float* beta = params[this->params[1]].value.data();
  float* running_mean = params[this->params[2]].value.data();
  float* running_var = params[this->params[3]].value.data();
  const int64_t numel = shape_numel(shape());
  expect_numel(x, numel, *this, "x");
  expect_numel(y, numel, *this, "y");
  expect_numel(params[this->params[0]].value, channels_, *this, "weight");
  expect_numel(params[this->params[1]].value, channels_, *this, "bias");
  expect_numel(params[this->params[2]].value, channels_, *this, "running_mean");
  expect_numel(params[this->params[3]].value, channels_, *this, "running_var");
  const float* in = x.data();
  float* out = y.data();
  const int64_t plane = static_cast<int64_t>(height_) * width_;
  const int64_t channel_stride = plane;
  const int64_t batch_stride = channels_ * plane;
  const double count = static_cast<double>(batch_) * plane;
  const bool training = ws.training;
  float* saved_mean = saved_mean_.data();
  float* saved_invstd = saved_invstd_.data();

#pragma omp parallel for schedule(static)
  for (int c = 0; c < channels_; ++c) {
    float mean, invstd;
    if (training) {
      // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
      double sum = 0.0;
      for (int b = 0; b < batch_; ++b) {
        const float* row = in + b * batch_stride + c * channel_stride;
        float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
        for (int64_t i = 0; i < plane; ++i) partial += row[i];
        sum += partial;
      }
      const double batch_mean = sum / count;
      double squares = 0.0;
      for (int b = 0; b < batch_; ++b) {
        const float* row = in + b * batch_stride + c * channel_stride;
        const float centre = static_cast<float>(batch_mean);
        float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
        for (int64_t i = 0; i < plane; ++i) partial += (row[i] - centre) * (row[i] - centre);
        squares += partial;
      }
      const double batch_var = squares / count;
      mean = static_cast<float>(batch_mean);
      invstd = static_cast<float>(1.0 / std::sqrt(batch_var + eps_));
      saved_mean[c] = mean;
      saved_invstd[c] = invstd;
      running_mean[c] = (1.0f - momentum_) * running_mean[c] + momentum_ * mean;
      running_var[c] = (1.0f - momentum_) * running_var[c] +
                       momentum_ * static_cast<float>(batch_var * count / (count - 1.0));
    } else {
      mean = running_mean[c];
      invstd = 1.0f / std::sqrt(running_var[c] + eps_);
    }
    // y = scale * x + shift with scale = gamma * invstd, shift = beta - mean * scale.
    const float scale = gamma[c] * invstd;
    const float shift = beta[c] - mean * scale;
    for (int b = 0; b < batch_; ++b) {
      const float* row = in + b * batch_stride + c * channel_stride;
      float* out_row = out + b * batch_stride + c * channel_stride;
#pragma omp simd
      for (int64_t i = 0; i < plane; ++i) out_row[i] = scale * row[i] + shift;
    }
  }
  last_forward_training_ = training;
}

void BatchNorm2dOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(last_forward_training_, "batchnorm2d '", name,
           "': backward after an eval-mode forward is not supported");
  const float* in = ws.values[inputs[0]].data();
  const float* dy = ws.grads[outputs[0]].data();
  float* dx = ws.grads[inputs[0]].data();
  const float* gamma = params[this->params[0]].value.data();
  float* dgamma = params[this->params[0]].grad.data();
  float* dbeta = params[this->params[1]].grad.data();
  const int64_t plane = static_cast<int64_t>(height_) * width_;
  const int64_t batch_stride = channels_ * plane;
  const float count = static_cast<float>(batch_) * plane;
  const float* saved_mean = saved_mean_.data();
  const float* saved_invstd = saved_invstd_.data();

  // With x_hat = (x - mean) * invstd and y = gamma x_hat + beta, over the M values of a channel:
  //   dbeta  = sum dy,   dgamma = sum dy * x_hat
  //   dx     = gamma * invstd / M * (M dy - dbeta - x_hat * dgamma)
  // The last line is dy pushed through x_hat, minus its projection on the two directions that
  // the batch mean and variance remove (the constant vector and x_hat itself).
#pragma omp parallel for schedule(static)
  for (int c = 0; c < channels_; ++c) {
    const float mean = saved_mean[c];
    const float invstd = saved_invstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int b = 0; b < batch_; ++b) {
      const float* row = in + b * batch_stride + c * plane;
      const float* dy_row = dy + b * batch_stride + c * plane;
      float partial_dy = 0.0f, partial_dy_xhat = 0.0f;
#pragma omp simd reduction(+ : partial_dy, partial_dy_xhat)
      for (int64_t i = 0; i < plane; ++i) {
        partial_dy += dy_row[i];
        partial_dy_xhat += dy_row[i] * (row[i] - mean) * invstd;
      }
      sum_dy += partial_dy;
      sum_dy_xhat += partial_dy_xhat;
    }
    dbeta[c] += static_cast<float>(sum_dy);
    dgamma[c] += static_cast<float>(sum_dy_xhat);
    const float scale = gamma[c] * invstd;
    const float mean_dy = static_cast<float>(sum_dy) / count;
    const float mean_dy_xhat = static_cast<float>(sum_dy_xhat) / count;
    for (int b = 0; b < batch_; ++b) {
      const float* row = in + b * batch_stride + c * plane;
      const float* dy_row = dy + b * batch_stride + c * plane;
      float* dx_row = dx + b * batch_stride + c * plane;
#pragma omp simd
      for (int64_t i = 0; i < plane; ++i) {
        const float x_hat = (row[i] - mean) * invstd;
        dx_row[i] += scale * (dy_row[i] - mean_dy - x_hat * mean_dy_xhat);
      }
    }
  }
}

}  // namespace ft
