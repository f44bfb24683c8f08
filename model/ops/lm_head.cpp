// Tied LM head: a bias-free linear layer whose weight is the embedding table, so the math is
// linear_forward / linear_backward (model/ops/linear.h) with W = wte [V, C], and on cuda their
// *_cuda launchers.
#include "model/ops/lm_head.h"

#include "core/check.h"
#include "model/ops/linear.h"
#include "model/ops/op_checks.h"

namespace ft {

TiedLmHeadOp::TiedLmHeadOp(int64_t rows, int64_t channels, int64_t vocab)
    : rows_(rows), channels_(channels), vocab_(vocab) {
  FT_CHECK(rows > 0 && channels > 0 && vocab > 0, "TiedLmHeadOp: non-positive shape rows=", rows,
           " channels=", channels, " vocab=", vocab);
}

void TiedLmHeadOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 1, 1, 1);
  expect_numel(ws.values[inputs[0]], rows_ * channels_, *this, "input x");
  expect_numel(ws.values[outputs[0]], rows_ * vocab_, *this, "output logits");
  expect_numel(params[this->params[0]].value, vocab_ * channels_, *this, "wte");
}

void TiedLmHeadOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  FT_RUN_ON_CUDA(ws, linear_forward_cuda(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                                         params[this->params[0]].value.data(), nullptr, rows_,
                                         channels_, vocab_, 0, 0, ws.stream));
  linear_forward(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                 params[this->params[0]].value.data(), nullptr, rows_, channels_, vocab_);
}

// logits = x wte^T  =>  dx += dlogits wte (= when fresh), dwte += dlogits^T x (added to the
// embedding's share).
void TiedLmHeadOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const bool overwrite_dx = ws.grad_is_fresh(inputs[0]);
  FT_RUN_ON_CUDA(ws, linear_backward_cuda(ws.grads[inputs[0]].data(), overwrite_dx,
                                          params[this->params[0]].grad.data(), nullptr,
                                          ws.grads[outputs[0]].data(), ws.values[inputs[0]].data(),
                                          params[this->params[0]].value.data(), rows_, channels_,
                                          vocab_, 0, 0, ws.stream));
  linear_backward(ws.grads[inputs[0]].data(), overwrite_dx, params[this->params[0]].grad.data(),
                  nullptr, ws.grads[outputs[0]].data(), ws.values[inputs[0]].data(),
                  params[this->params[0]].value.data(), rows_, channels_, vocab_);
}

// y = x wte^T: a GEMM over the whole vocabulary; backward is the dx and dwte GEMMs.
OpCost TiedLmHeadOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(rows_) * channels_ * vocab_;
  cost.forward_flops = 2 * macs;
  cost.backward_flops = 4 * macs;
  cost.bytes_read += 4.0 * vocab_ * channels_;
  return cost;
}

}  // namespace ft
