// Softmax cross-entropy averaged over rows. Forward subtracts the row maximum before exp() so no
// logit can overflow, and computes the loss as logsumexp - logit[target] rather than log(prob),
// which stays finite even when the target's probability underflows to zero.
#include "model/ops/cross_entropy.h"

#include <cmath>

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

void check_class_targets(const char* who, const int32_t* targets, int64_t rows, int64_t classes) {
  for (int64_t row = 0; row < rows; ++row)
    FT_CHECK(targets[row] >= 0 && targets[row] < classes, who, ": target ", targets[row],
             " at row ", row, " is outside [0, ", classes, ")");
}

float softmax_cross_entropy_forward(float* probs, const float* logits, const int32_t* targets,
                                    int64_t rows, int64_t classes) {
  check_class_targets("cross_entropy", targets, rows, classes);
  double loss_sum = 0.0;
#pragma omp parallel for reduction(+ : loss_sum) if (rows * classes > 32768)
  for (int64_t row = 0; row < rows; ++row) {
    const float* logit_row = logits + row * classes;
    float* prob_row = probs + row * classes;
    const float max_logit = row_max(logit_row, classes);
    float sum = 0.0f;
    for (int64_t c = 0; c < classes; ++c) {
      prob_row[c] = std::exp(logit_row[c] - max_logit);
      sum += prob_row[c];
    }
    const float inv_sum = 1.0f / sum;
    for (int64_t c = 0; c < classes; ++c) prob_row[c] *= inv_sum;
    loss_sum += std::log(static_cast<double>(sum)) + max_logit - logit_row[targets[row]];
  }
  return static_cast<float>(loss_sum / static_cast<double>(rows));
}

// loss = (1/R) sum_r [logsumexp(z_r) - z_r[t_r]]  =>  dloss/dz_r[c] = (p_r[c] - [c == t_r]) / R,
// since d logsumexp(z)/dz[c] = softmax(z)[c].
void softmax_cross_entropy_backward(float* dlogits, float dloss, const float* probs,
                                    const int32_t* targets, int64_t rows, int64_t classes) {
  const float scale = dloss / static_cast<float>(rows);
#pragma omp parallel for if (rows * classes > 32768)
  for (int64_t row = 0; row < rows; ++row) {
    float* dlogit_row = dlogits + row * classes;
    const float* prob_row = probs + row * classes;
    for (int64_t c = 0; c < classes; ++c) dlogit_row[c] += scale * prob_row[c];
    dlogit_row[targets[row]] -= scale;
  }
}

SoftmaxCrossEntropyOp::SoftmaxCrossEntropyOp(int64_t rows, int64_t classes)
    : rows_(rows), classes_(classes) {
  FT_CHECK(rows > 0 && classes > 0, "SoftmaxCrossEntropyOp: non-positive shape rows=", rows,
           " classes=", classes);
}

void SoftmaxCrossEntropyOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 1, 1, 0);
  expect_numel(ws.values[inputs[0]], rows_ * classes_, *this, "input logits");
  expect_numel(ws.values[outputs[0]], 1, *this, "output loss");
  FT_CHECK(static_cast<int64_t>(ws.targets.size()) == rows_, "cross_entropy '", name,
           "': ", ws.targets.size(), " targets in the workspace, expected ", rows_);
}

// Before forward, so a replayed CUDA graph (which runs no host code in forward) is covered too.
void SoftmaxCrossEntropyOp::stage(Workspace& ws, ParamStore&) {
  if (ws.device == Device::kCpu) return;  // the CPU kernel checks as it reads
  check_wiring(ws);
  check_class_targets("cross_entropy", ws.targets.data(), rows_, classes_);
}

void SoftmaxCrossEntropyOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  if (probs_.numel() != rows_ * classes_ || probs_.device() != ws.device)
    probs_ = Tensor::empty({rows_, classes_}, ws.device);
  if (ws.device != Device::kCpu) {
    if (row_losses_.numel() != rows_ || row_losses_.device() != ws.device)
      row_losses_ = Tensor::empty({rows_}, ws.device);
  }
  FT_RUN_ON_CUDA(
      ws, softmax_cross_entropy_forward_cuda(ws.values[outputs[0]].data(), probs_.data(),
                                             row_losses_.data(), ws.values[inputs[0]].data(),
                                             ws.device_targets(), rows_, classes_, ws.stream));
  ws.values[outputs[0]].data()[0] = softmax_cross_entropy_forward(
      probs_.data(), ws.values[inputs[0]].data(), ws.targets.data(), rows_, classes_);
}

void SoftmaxCrossEntropyOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_CHECK(probs_.numel() == rows_ * classes_ && probs_.device() == ws.device, "cross_entropy '",
           name, "': backward before forward");
  FT_RUN_ON_CUDA(ws, softmax_cross_entropy_backward_cuda(
                         ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(), probs_.data(),
                         ws.device_targets(), rows_, classes_, ws.stream));
  softmax_cross_entropy_backward(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data()[0],
                                 probs_.data(), ws.targets.data(), rows_, classes_);
}

OpCost SoftmaxCrossEntropyOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double logits = static_cast<double>(rows_) * classes_;
  cost.forward_flops = 5 * logits;  // max, subtract, exp, sum, normalise
  cost.backward_flops = 2 * logits;
  cost.bytes_read += 4.0 * rows_;  // targets
  cost.bytes_written += 4.0 * logits;
  cost.saved_bytes = 4.0 * logits;  // the probabilities backward reads
  return cost;
}

}  // namespace ft
