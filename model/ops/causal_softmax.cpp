// Causal softmax (see causal_softmax.h): one independent row of T per (b, h, t).
#include "model/ops/causal_softmax.h"

#include <cmath>

#include "core/check.h"
#include "core/math/fast_exp.h"
#include "model/ops/op_checks.h"

namespace ft {

void causal_softmax_forward(float* probs, const float* scores, int64_t rows, int seq_len) {
  const int64_t T = seq_len;
#pragma omp parallel for if (rows * T > 65536)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row % T;
    const float* s_row = scores + row * T;
    float* p_row = probs + row * T;
    float max_score = s_row[0];
#pragma omp simd reduction(max : max_score)
    for (int64_t s = 1; s <= t; ++s) max_score = s_row[s] > max_score ? s_row[s] : max_score;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t s = 0; s <= t; ++s) {
      p_row[s] = fast_exp(s_row[s] - max_score);
      sum += p_row[s];
    }
    const float inv_sum = 1.0f / sum;
#pragma omp simd
    for (int64_t s = 0; s <= t; ++s) p_row[s] *= inv_sum;
    for (int64_t s = t + 1; s < T; ++s) p_row[s] = 0.0f;
  }
}

void causal_softmax_backward(float* dscores, const float* dprobs, const float* probs,
                             bool overwrite, int64_t rows, int seq_len) {
  const int64_t T = seq_len;
#pragma omp parallel for if (rows * T > 65536)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t t = row % T;
    const float* p_row = probs + row * T;
    const float* dp_row = dprobs + row * T;
    float* ds_row = dscores + row * T;
    // P = exp(S) / sum exp(S) over s <= t  =>  dS = P (dP - <P, dP>); above the diagonal P is
    // a constant 0, so dS is 0 there.
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t s = 0; s <= t; ++s) dot += p_row[s] * dp_row[s];
    if (overwrite) {
#pragma omp simd
      for (int64_t s = 0; s <= t; ++s) ds_row[s] = p_row[s] * (dp_row[s] - dot);
      for (int64_t s = t + 1; s < T; ++s) ds_row[s] = 0.0f;
    } else {
#pragma omp simd
      for (int64_t s = 0; s <= t; ++s) ds_row[s] += p_row[s] * (dp_row[s] - dot);
    }
  }
}

CausalSoftmaxOp::CausalSoftmaxOp(int batch, int n_head, int seq_len)
    : batch_(batch), n_head_(n_head), seq_len_(seq_len) {
  FT_CHECK(batch > 0 && n_head > 0 && seq_len > 0,
           "CausalSoftmaxOp: non-positive shape batch=", batch, " n_head=", n_head,
           " seq_len=", seq_len);
}

void CausalSoftmaxOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 1, 1, 0);
  const int64_t numel = static_cast<int64_t>(batch_) * n_head_ * seq_len_ * seq_len_;
  expect_numel(ws.values[inputs[0]], numel, *this, "input scores");
  expect_numel(ws.values[outputs[0]], numel, *this, "output probs");
}

void CausalSoftmaxOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws, causal_softmax_forward_cuda(
                         ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                         static_cast<int64_t>(batch_) * n_head_ * seq_len_, seq_len_, ws.stream));
  causal_softmax_forward(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                         static_cast<int64_t>(batch_) * n_head_ * seq_len_, seq_len_);
}

void CausalSoftmaxOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws, causal_softmax_backward_cuda(
                         ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                         ws.values[outputs[0]].data(), ws.grad_is_fresh(inputs[0]),
                         static_cast<int64_t>(batch_) * n_head_ * seq_len_, seq_len_, ws.stream));
  causal_softmax_backward(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                          ws.values[outputs[0]].data(), ws.grad_is_fresh(inputs[0]),
                          static_cast<int64_t>(batch_) * n_head_ * seq_len_, seq_len_);
}

OpCost CausalSoftmaxOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  // Lower triangle only: max, subtract-exp, sum and scale forward; dot and dS backward.
  const double entries = static_cast<double>(batch_) * n_head_ * seq_len_ * (seq_len_ + 1) / 2;
  cost.forward_flops = 4 * entries;
  cost.backward_flops = 4 * entries;
  return cost;
}

}  // namespace ft
