// BatchNormInferenceOp: BatchNorm2d of an eval graph, normalising channels-last (NHWC)
// activations with the running statistics, as PyTorch BatchNorm2d in eval mode:
//   y = gamma_c * (x - running_mean_c) / sqrt(running_var_c + eps) + beta_c
// Samples stay independent and the statistics are never touched. Forward only: eval graphs have
// no backward. The train-graph twin is BatchNorm2dOp (model/ops/batchnorm.h), whose wiring this
// op shares, so checkpoints and builders treat the two alike.
// Inputs {x [B,H,W,C]}, outputs {y [B,H,W,C]},
// params {weight (gamma) [C], bias (beta) [C], running_mean [C], running_var [C]}.
// Thread safety: one thread per op; rows run in parallel with OpenMP.
#pragma once
#include "model/ops/batchnorm.h"

namespace ft {

// The eval-graph members of the BatchNorm family: the running statistics' normalisation
// (BatchNormInferenceOp; fusion/'s BatchNormInferenceReluOp). Checks the wiring and hands the op's
// tensors to its forward_impl, which calls the kernels. Forward only.
class BatchNormInferenceBase : public Op {
 public:
  // Checks the wiring, then forward_impl.
  void forward(Workspace& ws, ParamStore& params) override;
  // Throws ft::Error: an eval graph has no backward.
  void backward(Workspace& ws, ParamStore& params) override;

  int batch() const { return batch_; }
  int channels() const { return channels_; }
  int height() const { return height_; }
  int width() const { return width_; }
  float eps() const { return eps_; }
  Shape shape() const { return {batch_, height_, width_, channels_}; }

 protected:
  // REQUIRES: positive sizes and eps; `kind` names the op in the checks' messages.
  BatchNormInferenceBase(const char* kind, int batch, int channels, int height, int width,
                         float eps);
  int64_t rows() const { return rows_; }
  // The op's kernels on `b` (x, params and eps; y = outputs[0]) in `scratch`.
  virtual void forward_impl(Workspace& ws, const BatchNormBranch& b, BatchNormScratch& scratch) = 0;

 private:
  int batch_, channels_, height_, width_;
  int64_t rows_;  // B*H*W
  float eps_;
  BatchNormScratch scratch_;
};

class BatchNormInferenceOp : public BatchNormInferenceBase {
 public:
  // REQUIRES: as BatchNormInferenceBase.
  BatchNormInferenceOp(int batch, int channels, int height, int width, float eps = 1e-5f);

  OpKind op_kind() const override { return OpKind::kBatchNormInference; }
  OpCost cost(const Graph& graph) const override;

 protected:
  void forward_impl(Workspace& ws, const BatchNormBranch& b, BatchNormScratch& scratch) override;
};

}  // namespace ft
