// ReluOp forward and backward. Backward needs no saved mask: the workspace still holds the
// output y, and y > 0 exactly where x > 0. It reads y rather than x because in a ResNet the next
// op's backward (a convolution's weight gradient) has just read y, so y is in cache while x was
// last touched in forward; that saves one trip to memory per element.
#include "model/ops/relu.h"

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

void relu_forward(float* y, const float* x, int64_t numel) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < numel; ++i) y[i] = relu_value(x[i]);
}

// dx += dy where x > 0 (equivalently y > 0), else nothing (the kink at 0 takes gradient 0, as
// PyTorch).
void relu_backward(float* dx, const float* dy, const float* y, int64_t numel, bool dx_fresh) {
  if (dx_fresh) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < numel; ++i) dx[i] = relu_gradient(dy[i], y[i]);
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < numel; ++i) dx[i] += relu_gradient(dy[i], y[i]);
}

ReluOp::ReluOp(int64_t numel) : numel_(numel) {
  FT_CHECK(numel > 0, "relu: numel must be positive, got ", numel);
}

void ReluOp::forward(Workspace& ws, ParamStore&) {
  expect_arity(*this, 1, 1, 0);
  const Tensor& x = ws.values[inputs[0]];
  Tensor& y = ws.values[outputs[0]];
  expect_numel(x, numel_, *this, "x");
  expect_numel(y, numel_, *this, "y");
  FT_RUN_ON_CUDA(ws, relu_forward_cuda(y.data(), x.data(), numel_, ws.stream));
  relu_forward(y.data(), x.data(), numel_);
}

void ReluOp::backward(Workspace& ws, ParamStore&) {
  FT_RUN_ON_CUDA(ws, relu_backward_cuda(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                                        ws.values[outputs[0]].data(), numel_,
                                        ws.grad_is_fresh(inputs[0]), ws.stream));
  relu_backward(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                ws.values[outputs[0]].data(), numel_, ws.grad_is_fresh(inputs[0]));
}

OpCost ReluOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  cost.forward_flops = static_cast<double>(numel_);
  cost.backward_flops = static_cast<double>(numel_);
  return cost;
}

}  // namespace ft
