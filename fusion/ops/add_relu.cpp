// AddReluOp: per element, forward reads a and b and writes y (12 bytes) where the unfused pair
// reads a, b, writes s, reads s, writes y (20); backward reads y and dy and writes da and db (16)
// where ReluOp reads y, dy, writes ds and ResidualAddOp reads ds, writes da and db (24).
#include "fusion/ops/add_relu.h"

#include "core/check.h"
#include "model/ops/op_checks.h"
#include "model/ops/relu.h"

namespace ft {

void add_relu_forward(float* y, const float* a, const float* b, int64_t numel) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < numel; ++i) {
    y[i] = relu_value(a[i] + b[i]);
  }
}

namespace {

template <bool kFreshA, bool kFreshB>
void pass_masked_gradient(float* da, float* db, const float* dy, const float* y, int64_t numel) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < numel; ++i) {
    const float ds = relu_gradient(dy[i], y[i]);
    da[i] = kFreshA ? ds : da[i] + ds;
    db[i] = kFreshB ? ds : db[i] + ds;
  }
}

}  // namespace

void add_relu_backward(float* da, float* db, const float* dy, const float* y, int64_t numel,
                       bool da_fresh, bool db_fresh) {
  if (da_fresh && db_fresh)
    pass_masked_gradient<true, true>(da, db, dy, y, numel);
  else if (da_fresh)
    pass_masked_gradient<true, false>(da, db, dy, y, numel);
  else if (db_fresh)
    pass_masked_gradient<false, true>(da, db, dy, y, numel);
  else
    pass_masked_gradient<false, false>(da, db, dy, y, numel);
}

AddReluOp::AddReluOp(int64_t numel) : numel_(numel) {
  FT_CHECK(numel > 0, "add_relu: numel must be positive, got ", numel);
}

void AddReluOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 2, 1, 0);
  FT_CHECK(inputs[0] != inputs[1], "add_relu '", name, "': both inputs are value ", inputs[0]);
  expect_numel(ws.values[inputs[0]], numel_, *this, "input a");
  expect_numel(ws.values[inputs[1]], numel_, *this, "input b");
  expect_numel(ws.values[outputs[0]], numel_, *this, "output");
}

void AddReluOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws,
                 add_relu_forward_cuda(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                                       ws.values[inputs[1]].data(), numel_, ws.stream));
  add_relu_forward(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                   ws.values[inputs[1]].data(), numel_);
}

void AddReluOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws, add_relu_backward_cuda(
                         ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(),
                         ws.grads[outputs[0]].data(), ws.values[outputs[0]].data(), numel_,
                         ws.grad_is_fresh(inputs[0]), ws.grad_is_fresh(inputs[1]), ws.stream));
  add_relu_backward(ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(),
                    ws.grads[outputs[0]].data(), ws.values[outputs[0]].data(), numel_,
                    ws.grad_is_fresh(inputs[0]), ws.grad_is_fresh(inputs[1]));
}

OpCost AddReluOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  cost.forward_flops = 2.0 * static_cast<double>(numel_);   // add, max
  cost.backward_flops = 3.0 * static_cast<double>(numel_);  // mask, two adds
  return cost;
}

}  // namespace ft
