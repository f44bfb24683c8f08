// ReluOp: y = max(x, 0) elementwise; backward reads y (see relu.cpp).
// Inputs {x [numel]}, outputs {y [numel]} (any shape of that size), no params.
// The math is in relu_forward / relu_backward, which fused ops call too.
// Thread safety: one training thread per op; loops are parallel with OpenMP.
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

// y = x > 0 ? x : 0 (NaN and -0 give 0).
void relu_forward(float* y, const float* x, int64_t numel);
// dx (+)= dy where y > 0, else nothing; `=` (0 where y <= 0) when dx_fresh.
void relu_backward(float* dx, const float* dy, const float* y, int64_t numel, bool dx_fresh);

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
