// GELU activation, tanh approximation (GPT-2), elementwise over `numel` floats:
//   y = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2/pi)    (core/math/gelu_math.h)
// Inputs {x}, outputs {y}. Backward reads x again, so nothing is saved.
// The kernels are kernels/gelu.h's (CPU and CUDA), which fusion/'s GeluCastOp calls too.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "kernels/gelu.h"
#include "model/graph.h"

namespace ft {

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
