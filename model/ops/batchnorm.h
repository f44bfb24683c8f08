// BatchNorm2dOp: per-channel normalisation of channels-last (NHWC) activations, with PyTorch
// BatchNorm2d semantics. Over the M = B*H*W values of channel c:
// Training (ws.training):  mean_c, var_c over (b, h, w), var biased (divide by M);
//   y = gamma_c * (x - mean_c) / sqrt(var_c + eps) + beta_c
//   running_mean = (1 - m) running_mean + m mean_c
//   running_var  = (1 - m) running_var  + m var_c * M / (M - 1)     (unbiased, as PyTorch)
// Eval: the same normalisation with the running statistics, which stay untouched.
// Inputs {x [B,H,W,C]}, outputs {y [B,H,W,C]},
// params {weight (gamma) [C], bias (beta) [C], running_mean [C], running_var [C]}; the last two
// are buffers (not trainable).
// Thread safety: one training thread per op; loops are parallel over row chunks with OpenMP, and
// statistics are summed in a fixed chunk order, so results do not depend on the thread count.
#pragma once
#include <vector>

#include "model/graph.h"

namespace ft {

class BatchNorm2dOp : public Op {
 public:
  // REQUIRES: positive sizes and batch*height*width >= 2 (the unbiased variance needs two).
  BatchNorm2dOp(int batch, int channels, int height, int width, float momentum = 0.1f,
                float eps = 1e-5f);

  OpKind op_kind() const override { return OpKind::kBatchNorm; }
  void forward(Workspace& ws, ParamStore& params) override;
  // REQUIRES: the last forward ran in training mode (eval-mode backward is not implemented).
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }

  Shape shape() const { return {batch_, height_, width_, channels_}; }

 private:
  int batch_, channels_, height_, width_;
  int64_t rows_;  // B*H*W, the values per channel
  float momentum_, eps_;
  std::vector<float> saved_mean_;    // [C] batch mean of the last training forward
  std::vector<float> saved_invstd_;  // [C] 1 / sqrt(batch var + eps) of the last training forward
  std::vector<float> chunk_sums_;    // [chunks][2][C] float partial sums over row chunks
  std::vector<double> sums_;         // [2][C] their totals, summed in chunk order
  std::vector<float> coefficients_;  // [3][C] per-channel factors of the elementwise passes
  bool last_forward_training_ = false;
};

}  // namespace ft
