// Softmax cross-entropy: loss = mean over rows of -log softmax(logits[row])[target[row]].
// Inputs {logits [rows, classes]}, outputs {loss [1]}; targets come from Workspace::targets.
// The op keeps the softmax probabilities from forward for its backward.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "model/graph.h"

namespace ft {

// max over row[0, n) (n >= 1), vectorised: std::fmax is a libm call per element here, which
// made the max a third of the softmax's time at vocabulary 256.
inline float row_max(const float* row, int64_t n) {
  float max_value = row[0];
#if defined(_OPENMP)  // nvcc's host pass includes this header without OpenMP
#pragma omp simd reduction(max : max_value)
#endif
  for (int64_t i = 1; i < n; ++i) max_value = row[i] > max_value ? row[i] : max_value;
  return max_value;
}

// Throws ft::Error naming `who` unless every targets[row] is in [0, classes).
void check_class_targets(const char* who, const int32_t* targets, int64_t rows, int64_t classes);

// Writes probs [rows, classes] and returns the mean loss (accumulated in double).
// REQUIRES: every target in [0, classes) (checked).
float softmax_cross_entropy_forward(float* probs, const float* logits, const int32_t* targets,
                                    int64_t rows, int64_t classes);
// dlogits += dloss * (probs - onehot(target)) / rows.
void softmax_cross_entropy_backward(float* dlogits, float dloss, const float* probs,
                                    const int32_t* targets, int64_t rows, int64_t classes);

// The same on device pointers, enqueued on `stream` (cross_entropy.cu; CUDA builds only): one
// block per row writes probs and the row's loss into `row_losses` [rows], then
// mean_row_losses_cuda writes their mean to loss[0]. dloss is a device pointer too (the loss
// gradient the executor seeds). REQUIRES: targets checked on the host (check_class_targets).
void softmax_cross_entropy_forward_cuda(float* loss, float* probs, float* row_losses,
                                        const float* logits, const int32_t* targets, int64_t rows,
                                        int64_t classes, CudaStream stream);
void softmax_cross_entropy_backward_cuda(float* dlogits, const float* dloss, const float* probs,
                                         const int32_t* targets, int64_t rows, int64_t classes,
                                         CudaStream stream);
// loss[0] = mean of row_losses[0, rows), summed in double by one block in a fixed order, so the
// loss is the same bits run after run (no atomics). Also used by fusion/ops/classifier.cu.
void mean_row_losses_cuda(float* loss, const float* row_losses, int64_t rows, CudaStream stream);

class SoftmaxCrossEntropyOp : public Op {
 public:
  SoftmaxCrossEntropyOp(int64_t rows, int64_t classes);
  OpKind op_kind() const override { return OpKind::kCrossEntropy; }
  // cuda: checks ws.targets on the host, which the kernels index with through their device copy.
  void stage(Workspace& ws, ParamStore& params) override;
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;

  // Softmax of the last forward's logits, [rows, classes].
  const Tensor& probs() const { return probs_; }

 private:
  void check_wiring(const Workspace& ws) const;
  int64_t rows_, classes_;
  Tensor probs_;       // allocated on first forward, on the workspace's device
  Tensor row_losses_;  // cuda only: [rows], reduced to the mean by one block
};

}  // namespace ft
