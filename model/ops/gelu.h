// GELU activation, tanh approximation (GPT-2), elementwise over `numel` floats:
//   y = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi)    (core/math/gelu_math.h)
// Inputs {x}, outputs {y}. Backward reads x again, so nothing is saved.
// The CPU loops (gelu.cpp) and the CUDA kernels (gelu.cu) call the same helpers; they use a
// vectorisable exp (libm's scalar tanhf cost 4-30 ns per call and made GELU the most expensive op
// of a small GPT step).
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

void gelu_forward(float* y, const float* x, int64_t numel);
// dx += dy * gelu'(x).
void gelu_backward(float* dx, const float* dy, const float* x, int64_t numel);
// The same on device pointers, enqueued on `stream` (gelu.cu; CUDA builds only).
void gelu_forward_cuda(float* y, const float* x, int64_t numel, CudaStream stream);
void gelu_backward_cuda(float* dx, const float* dy, const float* x, int64_t numel,
                        CudaStream stream);

class GeluOp : public Op {
 public:
  explicit GeluOp(int64_t numel);
  OpKind op_kind() const override { return OpKind::kGelu; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;

 private:
  void check_wiring(const Workspace& ws) const;
  int64_t numel_;
};

}  // namespace ft
