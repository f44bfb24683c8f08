// BatchNormAddReluOp (train graphs): the end of a ResNet block, BatchNorm -> residual add -> ReLU,
// as one op:
//   y = max(z + s, 0),   z = gamma_c (x - mean_c) / sqrt(var_c + eps) + beta_c (batch statistics)
// The shortcut s is the block input r itself (identity blocks), or the shortcut convolution's
// own BatchNorm, s = BN_s(x_s) with its own batch statistics (downsampling blocks; the op then
// absorbs four eager ops). Neither z, BN_s(x_s) nor z + s reaches memory.
// Backward: with u = z + s and y = relu(u), du = dy [u > 0] = dy [y > 0], read from the saved y
// as ReluOp does, and a sum hands du unchanged to both summands. So dz = du, and
//   identity shortcut:    dr (+)= du
//   normalised shortcut:  BN_s's backward with du as its output gradient;
// the main BatchNorm's backward also takes du (dbeta = sum du, dgamma = sum du x_hat,
// dx = gamma invstd / M (M du - dbeta - x_hat dgamma); derived in kernels/batchnorm_loops.h).
// du is formed as each element is read and never stored.
// Per element (4 bytes each, fresh gradients) against the unfused chain: forward reads x twice
// and r once and writes y (4) instead of BatchNorm's 3 + add+ReLU's 3; with BN_s, 5 instead of 9.
// Backward reads dy, y and x twice and writes dx and dr (8) instead of add+ReLU's 4 + BatchNorm's
// 5. With BN_s the CPU recomputes u = z + z_s from x and x_s instead of reading y, and sums both
// BatchNorms' reductions in one pass: dy, x and x_s twice, writes dx and dx_s (8) instead of 14
// (CUDA reads y and reduces per branch: 12).
// The unfused twin is BatchNorm2dOp (and BN_s) -> ResidualAddOp -> ReluOp; they agree bit for
// bit (tests/fusion_bn_add_relu_test.cpp). fusion/bn_relu_pass.cpp builds this op.
// Under train.precision: bf16 fusion/cast_pass.cpp lets it write y in bf16 when a cast for a
// convolution is y's only reader; the twin is the op followed by the cast
// (tests/resnet_bf16_test.cpp, bit for bit).
// Inputs {x [B,H,W,C], r or x_s [B,H,W,C]}, outputs {y [B,H,W,C]} (the ReLU's output value),
// params {gamma, beta, running_mean, running_var} of the main BatchNorm, then the same four of
// BN_s when the shortcut is normalised.
// Thread safety: one training thread per op; loops run on OpenMP with fixed reduction order.
#pragma once
#include <array>
#include <vector>

#include "model/ops/batchnorm.h"

namespace ft {

// Each BatchNorm of the op is a BatchNormBranch (kernels/batchnorm.h) on the op's device.

// The identity shortcut: r, and its gradient dr (+)= du (= when dr_fresh).
struct BatchNormAddReluIdentity {
  const float* r = nullptr;
  float* dr = nullptr;
  bool dr_fresh = false;
};

// Forward and backward on [rows, channels] floats: the shortcut is `shortcut_bn` when not null,
// else `identity`. The CPU functions sum in the BatchNorm scratches (one per branch).
void batchnorm_add_relu_forward(float* y, const BatchNormBranch& main,
                                const BatchNormBranch* shortcut_bn,
                                const BatchNormAddReluIdentity& identity, int64_t rows,
                                int channels, std::array<BatchNormScratch, 2>& scratch);
// The same with y in bf16 (train.precision: bf16, where y only feeds a convolution's cast): each
// element rounded once from the value the fp32 form stores.
void batchnorm_add_relu_forward(bf16_bits* y, const BatchNormBranch& main,
                                const BatchNormBranch* shortcut_bn,
                                const BatchNormAddReluIdentity& identity, int64_t rows,
                                int channels, std::array<BatchNormScratch, 2>& scratch);
void batchnorm_add_relu_backward(const float* dy, const float* y, const BatchNormBranch& main,
                                 const BatchNormBranch* shortcut_bn,
                                 const BatchNormAddReluIdentity& identity, int64_t rows,
                                 int channels, std::array<BatchNormScratch, 2>& scratch);
// The same on device pointers, enqueued on `stream` (batchnorm_add_relu.cu; CUDA builds only),
// y fp32 or bf16; backward reads y in fp32 (a bf16 y widened first).
void batchnorm_add_relu_forward_cuda(float* y, const BatchNormBranch& main,
                                     const BatchNormBranch* shortcut_bn,
                                     const BatchNormAddReluIdentity& identity, int64_t rows,
                                     int channels, CudaStream stream);
void batchnorm_add_relu_forward_cuda(bf16_bits* y, const BatchNormBranch& main,
                                     const BatchNormBranch* shortcut_bn,
                                     const BatchNormAddReluIdentity& identity, int64_t rows,
                                     int channels, CudaStream stream);
void batchnorm_add_relu_backward_cuda(const float* dy, const float* y, const BatchNormBranch& main,
                                      const BatchNormBranch* shortcut_bn,
                                      const BatchNormAddReluIdentity& identity, int64_t rows,
                                      int channels, CudaStream stream);

// The settings of one of the op's BatchNorms.
struct BatchNormSettings {
  float momentum = 0.1f, eps = 1e-5f;
};

class BatchNormAddReluOp : public Op {
 public:
  // shortcut_bn: the shortcut's BatchNorm settings, or null for an identity shortcut.
  // REQUIRES: positive sizes and batch*height*width >= 2, as BatchNorm2dOp.
  BatchNormAddReluOp(int batch, int channels, int height, int width, BatchNormSettings main,
                     const BatchNormSettings* shortcut_bn);

  OpKind op_kind() const override { return OpKind::kBatchNormAddRelu; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  // y may be bf16 (fusion.vertical.cast).
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  bool normalised_shortcut() const { return normalised_shortcut_; }
  Shape shape() const { return {batch_, height_, width_, channels_}; }

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  // Branch 0 (main) or 1 (shortcut BN) on the workspace's device.
  BatchNormBranch branch(int which, Workspace& ws, ParamStore& params);
  BatchNormAddReluIdentity identity(Workspace& ws) const;
  // y as backward's mask reads it: y itself, or a bf16 y widened into widened_output_ (CPU) or
  // widened_output_device_ (cuda); null when the CPU recomputes the mask instead.
  const float* relu_output(const Workspace& ws);

  int batch_, channels_, height_, width_;
  int64_t rows_;
  bool normalised_shortcut_;
  std::array<BatchNormSettings, 2> settings_;
  std::array<std::vector<float>, 2> saved_mean_, saved_invstd_;  // host, per branch
  std::array<BatchNormScratch, 2> scratch_;
  std::vector<float> widened_output_;
  Tensor widened_output_device_;  // kept between steps: a captured CUDA graph keeps its address
  bool forward_ran_ = false;
};

}  // namespace ft
