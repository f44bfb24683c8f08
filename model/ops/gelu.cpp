// GELU, tanh approximation, with the constants of core/math/gelu.h and a vectorisable tanh.
#include "model/ops/gelu.h"

#include "core/check.h"
#include "core/math/gelu.h"
#include "model/ops/op_checks.h"

namespace ft {

void gelu_forward(float* y, const float* x, int64_t numel) {
#pragma omp parallel for if (numel > 262144)
  for (int64_t i = 0; i < numel; ++i) {
    const float v = x[i];
    const float t = tanh_rational(kGeluScale * (v + kGeluCubic * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

// With t = tanh(u), u = s (x + c x^3):
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2),  and dx = dy * gelu'(x).
void gelu_backward(float* dx, const float* dy, const float* x, int64_t numel) {
#pragma omp parallel for if (numel > 262144)
  for (int64_t i = 0; i < numel; ++i) {
    const float v = x[i];
    const float t = tanh_rational(kGeluScale * (v + kGeluCubic * v * v * v));
    const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] += dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du_dx);
  }
}

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
  gelu_forward(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(), numel_);
}

void GeluOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  gelu_backward(ws.grads[inputs[0]].data(), ws.grads[outputs[0]].data(),
                ws.values[inputs[0]].data(), numel_);
}

}  // namespace ft
