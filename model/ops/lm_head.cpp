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

// logits = x wte^T is a bias-free Linear over all of wte: the Linear family's wiring, devices
// and bf16 path. Backward: dx += dlogits wte (= when fresh), dwte += dlogits^T x (added to the
// embedding's share).
void TiedLmHeadOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  linear_op_forward(*this, ws, params, rows_, channels_, vocab_, /*has_bias=*/false, 0);
}

void TiedLmHeadOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  linear_op_backward(*this, ws, params, rows_, channels_, vocab_, /*has_bias=*/false, 0);
}

// y = x wte^T: a GEMM over the whole vocabulary; backward is the dx and dwte GEMMs.
OpCost TiedLmHeadOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(rows_) * channels_ * vocab_;
  cost.forward_flops = 2 * macs;
  cost.backward_flops = 4 * macs;
  cost.bytes_read += graph.element_bytes(inputs[0]) * vocab_ * channels_;
  return cost;
}

}  // namespace ft
