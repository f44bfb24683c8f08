// Vertical fusion of BatchNorm and the ReLU after it, in one pass over the activations each way.
// BatchNormReluOp (train graphs): BatchNorm2d with batch statistics, then y = max(z, 0), where
//   z = gamma_c * (x - mean_c) / sqrt(var_c + eps) + beta_c
// Forward writes only y: z never reaches memory. Backward folds the ReLU mask into BatchNorm's
// backward. With dz = dy * [z > 0] (z > 0 exactly where y > 0; no z is stored: the CPU recomputes
// it from x with forward's expression, CUDA reads the mask from y), over the M = B*H*W values of
// channel c:
//   dbeta  = sum dz,   dgamma = sum dz * x_hat,   x_hat = (x - mean) * invstd
//   dx     = gamma * invstd / M * (M dz - sum dz - x_hat * sum dz * x_hat)
// (derived in kernels/batchnorm_loops.h). Running statistics move exactly as BatchNorm2dOp's.
// BatchNormInferenceReluOp (eval graphs): the same with the running statistics; forward only.
// The unfused twins are BatchNorm2dOp / BatchNormInferenceOp followed by ReluOp;
// fusion/bn_relu_pass.cpp builds these ops from them and tests/fusion_resnet_test.cpp checks
// that the two agree. Under train.precision: bf16, fusion/cast_pass.cpp lets BatchNormReluOp
// write its output in bf16 when a cast for a convolution is its only reader; the twin is the op
// followed by the cast (tests/resnet_bf16_test.cpp, bit for bit).
// Inputs {x [B,H,W,C]}, outputs {y [B,H,W,C]} (the ReLU's output value),
// params {weight (gamma) [C], bias (beta) [C], running_mean [C], running_var [C]}.
// Thread safety: one training thread per op; loops run on OpenMP with fixed reduction order.
#pragma once
#include "model/ops/batchnorm.h"
#include "model/ops/batchnorm_inference.h"

namespace ft {

class BatchNormReluOp : public BatchNormTrainOp {
 public:
  // REQUIRES: positive sizes and batch*height*width >= 2, as BatchNorm2dOp.
  BatchNormReluOp(int batch, int channels, int height, int width, float momentum = 0.1f,
                  float eps = 1e-5f);

  OpKind op_kind() const override { return OpKind::kBatchNormRelu; }
  OpCost cost(const Graph& graph) const override;
  // y may be bf16 (fusion.vertical.cast): forward rounds each element once, the CPU backward
  // never reads y, and cuda's reads its mask from the bf16 y.
  bool handles_bf16() const override { return true; }

 protected:
  void forward_impl(Workspace& ws, const BatchNormBranch& b, BatchNormScratch& scratch) override;
  void backward_impl(Workspace& ws, const BatchNormBranch& b, BatchNormScratch& scratch) override;
};

class BatchNormInferenceReluOp : public BatchNormInferenceBase {
 public:
  // REQUIRES: positive sizes and eps.
  BatchNormInferenceReluOp(int batch, int channels, int height, int width, float eps = 1e-5f);

  OpKind op_kind() const override { return OpKind::kBatchNormInferenceRelu; }
  OpCost cost(const Graph& graph) const override;

 protected:
  void forward_impl(Workspace& ws, const BatchNormBranch& b, BatchNormScratch& scratch) override;
};

}  // namespace ft
