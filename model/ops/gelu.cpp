// GeluOp: the wiring around the GELU kernels of kernels/gelu.h (CPU and CUDA).
#include "model/ops/gelu.h"

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

GeluOp::GeluOp(int64_t numel) : numel_(numel) {
  FT_CHECK(numel > 0, "GeluOp: non-positive numel ", numel);
}

void GeluOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 1, 1, 0);
  expect_numel(ws.values[inputs[0]], numel_, *this, "input x");
  expect_numel(ws.values[outputs[0]], numel_, *this, "output y");
}

void GeluOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws, gelu_forward_cuda(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                                       numel_, ws.stream));
  gelu_forward(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(), numel_);
}

void GeluOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws, gelu_backward_cuda(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                                        ws.values[inputs[0]].data(), numel_, ws.stream));
  gelu_backward(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                ws.values[inputs[0]].data(), numel_);
}

OpCost GeluOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double elements = static_cast<double>(numel_);
  cost.forward_flops = 20 * elements;   // cube, tanh through exp, scale
  cost.backward_flops = 30 * elements;  // recomputes tanh, then gelu'(x) dy
  return cost;
}

}  // namespace ft
