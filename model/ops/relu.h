// ReluOp: y = max(x, 0) elementwise; backward reads y (see relu.cpp).
// Inputs {x [numel]}, outputs {y [numel]} (any shape of that size), no params.
// The math is in relu_forward / relu_backward, which fused ops call too.
// Thread safety: one training thread per op; loops are parallel with OpenMP.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/hd.h"
#include "model/graph.h"

namespace ft {

// The element math of the CPU loops and the CUDA kernels (relu.cu, fusion's add_relu.cu).
FT_HD float relu_value(float x) {
  return x > 0.0f ? x : 0.0f;
}
// The kink at 0 takes gradient 0, as PyTorch.
FT_HD float relu_gradient(float dy, float y) {
  return y > 0.0f ? dy : 0.0f;
}

// y = x > 0 ? x : 0 (NaN and -0 give 0).
void relu_forward(float* y, const float* x, int64_t numel);
// dx (+)= dy where y > 0, else nothing; `=` (0 where y <= 0) when dx_fresh.
void relu_backward(float* dx, const float* dy, const float* y, int64_t numel, bool dx_fresh);

// The same on device pointers, enqueued on `stream` (relu.cu; CUDA builds only).
void relu_forward_cuda(float* y, const float* x, int64_t numel, CudaStream stream);
void relu_backward_cuda(float* dx, const float* dy, const float* y, int64_t numel, bool dx_fresh,
                        CudaStream stream);

class ReluOp : public Op {
 public:
  explicit ReluOp(int64_t numel);

  OpKind op_kind() const override { return OpKind::kRelu; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int64_t numel() const { return numel_; }

 private:
  int64_t numel_;
};

}  // namespace ft
