// Softmax cross-entropy: loss = mean over rows of -log softmax(logits[row])[target[row]].
// Inputs {logits [rows, classes]}, outputs {loss [1]}; targets come from Workspace::targets.
// The op keeps the softmax probabilities from forward for its backward.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "model/graph.h"

namespace ft {

// Writes probs [rows, classes] and returns the mean loss (accumulated in double).
// REQUIRES: every target in [0, classes) (checked).
float softmax_cross_entropy_forward(float* probs, const float* logits, const int32_t* targets,
                                    int64_t rows, int64_t classes);
// dlogits += dloss * (probs - onehot(target)) / rows.
void softmax_cross_entropy_backward(float* dlogits, float dloss, const float* probs,
                                    const int32_t* targets, int64_t rows, int64_t classes);

class SoftmaxCrossEntropyOp : public Op {
 public:
  SoftmaxCrossEntropyOp(int64_t rows, int64_t classes);
  OpKind op_kind() const override { return OpKind::kCrossEntropy; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;

  // Softmax of the last forward's logits, [rows, classes].
  const Tensor& probs() const { return probs_; }

 private:
  void check_wiring(const Workspace& ws) const;
  int64_t rows_, classes_;
  Tensor probs_;  // allocated on first forward
};

}  // namespace ft
