// ReluOp forward and backward. Backward needs no saved mask: the workspace still holds the
// output y, and y > 0 exactly where x > 0. It reads y rather than x because in a ResNet the next
// op's backward (a convolution's weight gradient) has just read y, so y is in cache while x was
// last touched in forward; that saves one trip to memory per element.
#include "model/ops/relu.h"

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

ReluOp::ReluOp(int64_t numel) : numel_(numel) {
  FT_CHECK(numel > 0, "relu: numel must be positive, got ", numel);
}

void ReluOp::forward(Workspace& ws, ParamStore&) {
  expect_arity(*this, 1, 1, 0);
  const Tensor& x = ws.values[inputs[0]];
  Tensor& y = ws.values[outputs[0]];
  expect_numel(x, numel_, *this, "x");
  expect_numel(y, numel_, *this, "y");
  const float* in = x.data();
  float* out = y.data();
  const int64_t count = numel_;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

// dx += dy where x > 0 (equivalently y > 0), else nothing (the kink at 0 takes gradient 0, as
// PyTorch).
void ReluOp::backward(Workspace& ws, ParamStore&) {
  const float* out = ws.values[outputs[0]].data();
  const float* dy = ws.grads[outputs[0]].data();
  float* dx = ws.grads[inputs[0]].data();
  const int64_t count = numel_;
  if (ws.grad_is_fresh(inputs[0])) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) dx[i] = out[i] > 0.0f ? dy[i] : 0.0f;
    return;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dx[i] += out[i] > 0.0f ? dy[i] : 0.0f;
}

}  // namespace ft
