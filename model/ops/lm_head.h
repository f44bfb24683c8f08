// Tied language-model head: logits[rows, V] = x[rows, C] · wte[V, C]^T, reusing the token
// embedding table. Inputs {x}, outputs {logits}, params {wte}. Its wte gradient adds (+=) to the
// embedding's, which is what tying means for the gradient.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

class TiedLmHeadOp : public Op {
 public:
  TiedLmHeadOp(int64_t rows, int64_t channels, int64_t vocab);
  OpKind op_kind() const override { return OpKind::kLmHead; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  int64_t rows_, channels_, vocab_;
};

}  // namespace ft
