// Residual connection: out = a + b. The gradient of a sum passes unchanged to both summands.
#include "model/ops/residual.h"

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

void residual_forward(float* out, const float* a, const float* b, int64_t numel) {
  for (int64_t i = 0; i < numel; ++i) out[i] = a[i] + b[i];
}

// d(a + b)/da = d(a + b)/db = 1, so each input receives dout unchanged.
namespace {

template <bool kFreshA, bool kFreshB>
void pass_gradient(float* da, float* db, const float* dout, int64_t numel) {
  for (int64_t i = 0; i < numel; ++i) {
    da[i] = kFreshA ? dout[i] : da[i] + dout[i];
    db[i] = kFreshB ? dout[i] : db[i] + dout[i];
  }
}

}  // namespace

void residual_backward(float* da, float* db, const float* dout, int64_t numel, bool fresh_a,
                       bool fresh_b) {
  if (fresh_a && fresh_b)
    pass_gradient<true, true>(da, db, dout, numel);
  else if (fresh_a)
    pass_gradient<true, false>(da, db, dout, numel);
  else if (fresh_b)
    pass_gradient<false, true>(da, db, dout, numel);
  else
    pass_gradient<false, false>(da, db, dout, numel);
}

ResidualAddOp::ResidualAddOp(int64_t numel) : numel_(numel) {
  FT_CHECK(numel > 0, "ResidualAddOp: non-positive numel ", numel);
}

void ResidualAddOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 2, 1, 0);
  FT_CHECK(inputs[0] != inputs[1], "residual '", name, "': both inputs are value ", inputs[0]);
  expect_numel(ws.values[inputs[0]], numel_, *this, "input a");
  expect_numel(ws.values[inputs[1]], numel_, *this, "input b");
  expect_numel(ws.values[outputs[0]], numel_, *this, "output");
}

void ResidualAddOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws,
                 residual_forward_cuda(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                                       ws.values[inputs[1]].data(), numel_, ws.stream));
  residual_forward(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                   ws.values[inputs[1]].data(), numel_);
}

void ResidualAddOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(
      ws, residual_backward_cuda(ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(),
                                 ws.grads[outputs[0]].data(), numel_, ws.grad_is_fresh(inputs[0]),
                                 ws.grad_is_fresh(inputs[1]), ws.stream));
  residual_backward(ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(),
                    ws.grads[outputs[0]].data(), numel_, ws.grad_is_fresh(inputs[0]),
                    ws.grad_is_fresh(inputs[1]));
}

OpCost ResidualAddOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  cost.forward_flops = static_cast<double>(numel_);
  cost.backward_flops = 2.0 * static_cast<double>(numel_);  // da += dout, db += dout
  return cost;
}

}  // namespace ft
