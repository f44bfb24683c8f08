// QK-norm over the q and k slices of a [B, T, 3C] qkv activation. Each (token, head) slice is one
// LayerNorm row of width head_dim, so the row math is model/ops/layernorm_math.h; this file only
// walks the slices. Token rows are independent except for the shared weight gradients, which are
// accumulated in a separate serial pass.
#include "model/ops/qk_norm.h"

#include <algorithm>

#include "core/check.h"
#include "model/ops/layernorm_math.h"
#include "model/ops/op_checks.h"

namespace ft {

QkNormOp::QkNormOp(int batch, int seq_len, int channels, int n_head)
    : tokens_(static_cast<int64_t>(batch) * seq_len), channels_(channels), n_head_(n_head) {
  FT_CHECK(batch > 0 && seq_len > 0 && channels > 0 && n_head > 0,
           "QkNormOp: non-positive shape batch=", batch, " seq_len=", seq_len,
           " channels=", channels, " n_head=", n_head);
  FT_CHECK(channels % n_head == 0, "QkNormOp: channels ", channels, " not divisible by n_head ",
           n_head);
  head_dim_ = channels / n_head;
}

void QkNormOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 1, 1, 4);
  expect_numel(ws.values[inputs[0]], tokens_ * 3 * channels_, *this, "input qkv");
  expect_numel(ws.values[outputs[0]], tokens_ * 3 * channels_, *this, "output qkv_normed");
  const char* roles[4] = {"q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias"};
  for (int i = 0; i < 4; ++i)
    expect_numel(params[this->params[i]].value, head_dim_, *this, roles[i]);
}

void QkNormOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const int64_t slices = tokens_ * n_head_;
  q_mean_.resize(slices);
  q_rstd_.resize(slices);
  k_mean_.resize(slices);
  k_rstd_.resize(slices);
  const float* qkv = ws.values[inputs[0]].data();
  float* out = ws.values[outputs[0]].data();
  const float* q_weight = params[this->params[0]].value.data();
  const float* q_bias = params[this->params[1]].value.data();
  const float* k_weight = params[this->params[2]].value.data();
  const float* k_bias = params[this->params[3]].value.data();
  const int64_t row_width = 3 * static_cast<int64_t>(channels_);
#pragma omp parallel for if (tokens_ * row_width > 65536)
  for (int64_t token = 0; token < tokens_; ++token) {
    const float* in_row = qkv + token * row_width;
    float* out_row = out + token * row_width;
    for (int head = 0; head < n_head_; ++head) {
      const int64_t slice = token * n_head_ + head;
      const int64_t q_offset = static_cast<int64_t>(head) * head_dim_;
      const int64_t k_offset = channels_ + q_offset;
      layernorm_row_forward(out_row + q_offset, &q_mean_[slice], &q_rstd_[slice], in_row + q_offset,
                            q_weight, q_bias, head_dim_, kLayerNormEps);
      layernorm_row_forward(out_row + k_offset, &k_mean_[slice], &k_rstd_[slice], in_row + k_offset,
                            k_weight, k_bias, head_dim_, kLayerNormEps);
    }
    std::copy(in_row + 2 * channels_, in_row + row_width, out_row + 2 * channels_);
  }
}

// Each q/k slice backpropagates as an independent LayerNorm row (layernorm_math.h); the value
// slice is an identity, so its gradient passes through. The shared weights sum their gradient
// over every token and head.
void QkNormOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  FT_CHECK(static_cast<int64_t>(q_mean_.size()) == tokens_ * n_head_, "qk_norm '", name,
           "': backward before forward");
  const float* qkv = ws.values[inputs[0]].data();
  float* dqkv = ws.grads[inputs[0]].data();
  const float* dout = ws.grads[outputs[0]].data();
  const float* q_weight = params[this->params[0]].value.data();
  const float* k_weight = params[this->params[2]].value.data();
  const int64_t row_width = 3 * static_cast<int64_t>(channels_);
#pragma omp parallel for if (tokens_ * row_width > 65536)
  for (int64_t token = 0; token < tokens_; ++token) {
    const int64_t row = token * row_width;
    for (int head = 0; head < n_head_; ++head) {
      const int64_t slice = token * n_head_ + head;
      const int64_t q_at = row + static_cast<int64_t>(head) * head_dim_;
      const int64_t k_at = q_at + channels_;
      layernorm_row_backward_input(dqkv + q_at, dout + q_at, qkv + q_at, q_weight, q_mean_[slice],
                                   q_rstd_[slice], head_dim_);
      layernorm_row_backward_input(dqkv + k_at, dout + k_at, qkv + k_at, k_weight, k_mean_[slice],
                                   k_rstd_[slice], head_dim_);
    }
    for (int64_t c = 2 * channels_; c < row_width; ++c) dqkv[row + c] += dout[row + c];
  }
  float* dq_weight = params[this->params[0]].grad.data();
  float* dq_bias = params[this->params[1]].grad.data();
  float* dk_weight = params[this->params[2]].grad.data();
  float* dk_bias = params[this->params[3]].grad.data();
  for (int64_t token = 0; token < tokens_; ++token) {
    const int64_t row = token * row_width;
    for (int head = 0; head < n_head_; ++head) {
      const int64_t slice = token * n_head_ + head;
      const int64_t q_at = row + static_cast<int64_t>(head) * head_dim_;
      const int64_t k_at = q_at + channels_;
      layernorm_row_backward_params(dq_weight, dq_bias, dout + q_at, qkv + q_at, q_mean_[slice],
                                    q_rstd_[slice], head_dim_);
      layernorm_row_backward_params(dk_weight, dk_bias, dout + k_at, qkv + k_at, k_mean_[slice],
                                    k_rstd_[slice], head_dim_);
    }
  }
}

}  // namespace ft
