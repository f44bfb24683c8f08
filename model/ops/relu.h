// ReluOp: y = max(x, 0) elementwise; backward reads y (see relu.cpp).
// Inputs {x [numel]}, outputs {y [numel]} (any shape of that size), no params.
// Thread safety: one training thread per op; loops are parallel with OpenMP.
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

class ReluOp : public Op {
 public:
  explicit ReluOp(int64_t numel);

  OpKind op_kind() const override { return OpKind::kRelu; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }

 private:
  int64_t numel_;
};

}  // namespace ft
