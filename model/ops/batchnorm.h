// BatchNorm2dOp: per-channel normalisation of NCHW activations, PyTorch BatchNorm2d semantics.
// Training (ws.training):  mean_c, var_c over (b, h, w), var biased (divide by M = B*H*W);
//   y = gamma_c * (x - mean_c) / sqrt(var_c + eps) + beta_c
//   running_mean = (1 - m) running_mean + m mean_c
//   running_var  = (1 - m) running_var  + m var_c * M / (M - 1)     (unbiased, as PyTorch)
// Eval: the same normalisation with the running statistics, which stay untouched.
// Inputs {x [B,C,H,W]}, outputs {y [B,C,H,W]},
// params {weight (gamma) [C], bias (beta) [C], running_mean [C], running_var [C]}; the last two
// are buffers (not trainable).
// Thread safety: one training thread per op; loops are parallel over channels with OpenMP.
#pragma once
#include "model/graph.h"

namespace ft {

class BatchNorm2dOp : public Op {
 public:
  // REQUIRES: positive sizes and batch*height*width >= 2 (the unbiased variance needs two).
  BatchNorm2dOp(int batch, int channels, int height, int width, float momentum = 0.1f,
                float eps = 1e-5f);

  const char* kind() const override { return "batchnorm2d"; }
  void forward(Workspace& ws, ParamStore& params) override;
  // REQUIRES: the last forward ran in training mode (eval-mode backward is not implemented).
  void backward(Workspace& ws, ParamStore& params) override;

  Shape shape() const { return {batch_, channels_, height_, width_}; }

 private:
  int batch_, channels_, height_, width_;
  float momentum_, eps_;
  Tensor saved_mean_;     // [C] batch mean of the last training forward
  Tensor saved_invstd_;   // [C] 1 / sqrt(batch var + eps) of the last training forward
  bool last_forward_training_ = false;
};

}  // namespace ft
