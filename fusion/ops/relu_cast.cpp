#include "fusion/ops/relu_cast.h"

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

void relu_cast_forward(bf16_bits* y, const float* x, int64_t numel) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < numel; ++i) y[i] = relu_cast_value(x[i]);
}

void relu_cast_backward(float* dx, const float* dy, const bf16_bits* y, int64_t numel,
                        bool dx_fresh) {
  if (dx_fresh) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < numel; ++i) dx[i] = relu_cast_gradient(dy[i], y[i]);
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < numel; ++i) dx[i] += relu_cast_gradient(dy[i], y[i]);
}

ReluCastOp::ReluCastOp(int64_t numel) : numel_(numel) {
  FT_CHECK(numel > 0, "relu_cast: numel must be positive, got ", numel);
}

void ReluCastOp::forward(Workspace& ws, ParamStore&) {
  expect_arity(*this, 1, 1, 0);
  expect_numel(ws.values[inputs[0]], numel_, *this, "x");
  expect_numel(ws.values[outputs[0]], numel_, *this, "y");
  FT_RUN_ON_CUDA(ws, relu_cast_forward_cuda(ws.values[outputs[0]].bf16_data(),
                                            ws.values[inputs[0]].data(), numel_, ws.stream));
  relu_cast_forward(ws.values[outputs[0]].bf16_data(), ws.values[inputs[0]].data(), numel_);
}

void ReluCastOp::backward(Workspace& ws, ParamStore&) {
  FT_RUN_ON_CUDA(ws,
                 relu_cast_backward_cuda(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                                         ws.values[outputs[0]].bf16_data(), numel_,
                                         ws.grad_is_fresh(inputs[0]), ws.stream));
  relu_cast_backward(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                     ws.values[outputs[0]].bf16_data(), numel_, ws.grad_is_fresh(inputs[0]));
}

OpCost ReluCastOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  cost.forward_flops = static_cast<double>(numel_);
  cost.backward_flops = static_cast<double>(numel_);
  return cost;
}

}  // namespace ft
