// BatchNorm2dOp: per-channel normalisation of channels-last (NHWC) activations with batch
// statistics, as PyTorch BatchNorm2d in train mode. Over the M = B*H*W values of channel c:
//   mean_c, var_c over (b, h, w), var biased (divide by M);
//   y = gamma_c * (x - mean_c) / sqrt(var_c + eps) + beta_c
//   running_mean = (1 - m) running_mean + m mean_c
//   running_var  = (1 - m) running_var  + m var_c * M / (M - 1)     (unbiased, as PyTorch)
// Train graphs only: eval graphs normalise with the running statistics in BatchNormInferenceOp
// (model/ops/batchnorm_inference.h). The math is in kernels/batchnorm.h, whose loops the fused
// BatchNormReluOp (fusion/ops/batchnorm_relu.h) runs with a ReLU
// (fusion/ops/batchnorm_relu_kernels.h); this file holds the family's wiring.
// Inputs {x [B,H,W,C]}, outputs {y [B,H,W,C]},
// params {weight (gamma) [C], bias (beta) [C], running_mean [C], running_var [C]}; the last two
// are buffers (not trainable).
// Thread safety: one training thread per op; loops are parallel over row chunks with OpenMP, and
// statistics are summed in a fixed chunk order, so results do not depend on the thread count.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/batchnorm.h"
#include "model/graph.h"

namespace ft {

// The train-graph members of the BatchNorm family: BatchNorm with batch statistics (BatchNorm2dOp;
// fusion/'s BatchNormReluOp). Resolves the op's tensors and statistics on the workspace's device
// and hands them to the op's forward_impl and backward_impl, which call the kernels. Keeps the
// sizes, the statistics the last forward saved for backward, and the scratch.
class BatchNormTrainOp : public Op {
 public:
  // Checks the wiring, then forward_impl.
  void forward(Workspace& ws, ParamStore& params) override;
  // Checks that forward ran, then backward_impl with the branch's gradients filled in.
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }

  int batch() const { return batch_; }
  int channels() const { return channels_; }
  int height() const { return height_; }
  int width() const { return width_; }
  float momentum() const { return momentum_; }
  float eps() const { return eps_; }
  Shape shape() const { return {batch_, height_, width_, channels_}; }

 protected:
  // REQUIRES: positive sizes and batch*height*width >= 2 (the unbiased variance needs two);
  // `kind` names the op in the checks' messages.
  BatchNormTrainOp(const char* kind, int batch, int channels, int height, int width, float momentum,
                   float eps);
  int64_t rows() const { return rows_; }
  // The op's kernels on `b` (x = inputs[0]; y = outputs[0], dy its gradient) in `scratch`.
  virtual void forward_impl(Workspace& ws, const BatchNormBranch& b, BatchNormScratch& scratch) = 0;
  virtual void backward_impl(Workspace& ws, const BatchNormBranch& b,
                             BatchNormScratch& scratch) = 0;

 private:
  BatchNormBranch branch(Workspace& ws, ParamStore& params);

  int batch_, channels_, height_, width_;
  int64_t rows_;  // B*H*W, the values per channel
  float momentum_, eps_;
  std::vector<float> saved_mean_;    // [C] batch mean of the last forward
  std::vector<float> saved_invstd_;  // [C] 1 / sqrt(batch var + eps) of the last forward
  BatchNormScratch scratch_;
  bool forward_ran_ = false;
};

class BatchNorm2dOp : public BatchNormTrainOp {
 public:
  // REQUIRES: as BatchNormTrainOp.
  BatchNorm2dOp(int batch, int channels, int height, int width, float momentum = 0.1f,
                float eps = 1e-5f);

  OpKind op_kind() const override { return OpKind::kBatchNorm; }
  OpCost cost(const Graph& graph) const override;

 protected:
  void forward_impl(Workspace& ws, const BatchNormBranch& b, BatchNormScratch& scratch) override;
  void backward_impl(Workspace& ws, const BatchNormBranch& b, BatchNormScratch& scratch) override;
};

// Shared entry checks of the BatchNorm op family: sizes positive, `rows` (B*H*W) values per
// channel at least `min_rows`, eps positive, momentum in [0, 1].
void check_batchnorm_sizes(const char* kind, int batch, int channels, int height, int width,
                           int64_t min_rows, float momentum, float eps);
// x and y of `numel` floats, and the four per-channel params of `channels` floats each.
void check_batchnorm_wiring(const Op& op, const Workspace& ws, const ParamStore& params,
                            int64_t numel, int channels);
// The `which`-th BatchNorm of a family op on the workspace's device: x = op.inputs[which], params
// {gamma, beta, running_mean, running_var} = op.params[4 which ...], with `momentum` and `eps`.
// On cuda its statistics and buffers are scratch's device ones (allocated here); on the CPU the
// statistics are saved_mean and saved_invstd [channels]. The gradients are left null.
BatchNormBranch batchnorm_branch(const Op& op, int which, Workspace& ws, ParamStore& params,
                                 int64_t rows, int channels, float momentum, float eps,
                                 float* saved_mean, float* saved_invstd, BatchNormScratch& scratch);
// Op::cost plus the FLOPs of a normalisation and its per-channel params; with batch statistics
// (`batch_statistics`) also the reduction passes, the backward and the saved mean and invstd.
OpCost batchnorm_cost(const Op& op, const Graph& graph, int channels, bool batch_statistics);

}  // namespace ft
