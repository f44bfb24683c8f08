// ConvBiasOp: the inference convolution of a ResNet with its BatchNorm folded in, and the ReLU
// and residual add that follow applied before the output is stored:
//   y = act(conv(x, W') + b' [+ residual])        act = ReLU or identity
// Folding (fusion/fold_bn_pass.cpp), per output channel o, as torch.fx's fuse_conv_bn_eval:
//   s_o = gamma_o / sqrt(running_var_o + eps)
//   W'[o] = W[o] * s_o,   b'_o = (b_o - running_mean_o) * s_o + beta_o      (b = 0 without bias)
// because BN(conv(x, W) + b) = s (conv(x, W) + b - mean) + beta = conv(x, s W) + b'. Without
// affine parameters gamma = 1 and beta = 0. The fold runs in double precision.
// Two sources of W' and b':
//   kBatchNorm: params {conv weight, [gamma, beta,] running_mean, running_var}; the op derives
//               W' and b' itself, once per ParamStore::version(), so a pass never changes
//               parameters and an eval graph follows training without being rebuilt;
//   kFolded:    params {W', b'}, as `fusiontrain export` writes them and `infer` reads them.
// Forward only: eval graphs have no backward. The unfused twin is Conv2dOp -> BatchNormInferenceOp
// (-> ResidualAddOp) (-> ReluOp); tests/fold_bn_test.cpp checks they agree.
// On cuda (conv_bias.cu): the fold runs on a host copy of the parameters and W', b' are
// uploaded once per ParamStore::version(); then cuDNN's convolution (Winograd is a CPU-only
// choice) and one kernel for bias + residual + ReLU.
// Kernels: our Winograd F(4x4,3x3) with the epilogue inside its output transform where the shape
// allows (3x3, stride 1, 16k channels), else oneDNN's inference convolution with the bias and
// post-ops `sum` (the residual, copied into y first) and `eltwise_relu`. Weights are transformed
// or reordered once per version, not on every call as the training convolution must.
// Inputs {x, [residual]}, outputs {y [B,Ho,Wo,Cout]}.
// Thread safety: one thread per op; the kernels parallelise inside with OpenMP or oneDNN.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/hd.h"
#include "model/graph.h"
#include "model/ops/conv2d.h"

namespace ft {

// The fold of one output channel, shared by fold_batchnorm (T = double) and any device code:
//   s = gamma / sqrt(var + eps),   W' = W s,   b' = (b - mean) s + beta.
template <typename T>
FT_HD T fold_batchnorm_scale(T gamma, T running_var, T eps) {
  using std::sqrt;
  return gamma / sqrt(running_var + eps);
}
template <typename T>
FT_HD T fold_batchnorm_weight(T weight, T scale) {
  return weight * scale;
}
template <typename T>
FT_HD T fold_batchnorm_bias(T conv_bias, T running_mean, T scale, T beta) {
  return (conv_bias - running_mean) * scale + beta;
}

// W' = W * s and b' = (b - mean) * s + beta, s = gamma / sqrt(var + eps), in double.
// Outputs first: folded_weight [out, per_channel], folded_bias [out]. conv_bias, gamma and beta
// may be null (no conv bias: 0; no affine BN: gamma 1, beta 0).
// REQUIRES: running_var + eps > 0 for every channel (else throws ft::Error naming the channel).
void fold_batchnorm(float* folded_weight, float* folded_bias, const float* weight,
                    const float* conv_bias, const float* gamma, const float* beta,
                    const float* running_mean, const float* running_var, double eps,
                    int out_channels, int64_t per_channel);

// y = act(y + bias[c] (+ residual)) over NHWC y [rows, channels] in place, on device pointers
// enqueued on `stream` (conv_bias.cu; CUDA builds only); residual may be null.
void conv_bias_epilogue_cuda(float* y, const float* bias, const float* residual, int64_t rows,
                             int channels, bool relu, CudaStream stream);

// What a ConvBiasOp computes besides the convolution: the geometry of the Conv2dOp it replaces,
// and its epilogue.
struct ConvBiasSpec {
  int batch = 0, in_channels = 0, out_channels = 0, height = 0, width = 0;
  int kernel = 0, stride = 1, padding = 0;
  ActivationLayout input_layout = ActivationLayout::kNhwc;
  bool winograd = false;  // run on our Winograd kernels (the Conv2dOp resolved to kWinograd)
  WinogradTile winograd_tile = WinogradTile::k4x4;
  bool residual = false;  // inputs[1] is added before the activation
  bool relu = false;
  // kBatchNorm only:
  bool bn_affine = true;  // params include gamma and beta
  float eps = 1e-5f;
};

// The spec of `conv` with no epilogue.
ConvBiasSpec conv_bias_spec(const Conv2dOp& conv);

enum class ConvBiasSource { kBatchNorm, kFolded };

class ConvBiasOp : public Op {
 public:
  // REQUIRES: spec sizes as for Conv2dOp; winograd only where Conv2dOp would run it.
  ConvBiasOp(const ConvBiasSpec& spec, ConvBiasSource source);
  ~ConvBiasOp() override;

  OpKind op_kind() const override { return OpKind::kConvBias; }
  void forward(Workspace& ws, ParamStore& params) override;
  // Throws ft::Error: an eval graph has no backward.
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;
  // x may be bf16 (train.precision: bf16): y = act(conv(x, bf16(W')) + b' [+ residual]) with
  // fp32 accumulation, on oneDNN's bf16 kernel where the CPU has bf16 instructions
  // (bf16_gemm_native()), else on x widened to fp32 and the fp32 kernels above; on cuda on
  // cuDNN's bf16 convolution, which rounds conv(x, bf16(W')) to bf16 before the epilogue.
  bool handles_bf16() const override { return true; }

  const ConvBiasSpec& spec() const { return spec_; }
  ConvBiasSource source() const { return source_; }
  Shape output_shape() const;
  Shape weight_shape() const;
  // W' and b' as forward uses them, derived from `params` now (export calls this).
  void folded(const ParamStore& params, std::vector<float>* weight, std::vector<float>* bias) const;
  // The implementation forward runs: "winograd:f4x4_3x3+epilogue" or oneDNN's name; empty before
  // the first forward.
  const char* forward_impl() const;

 private:
  struct Kernels;  // transformed weights or oneDNN primitive, built on first forward
  void prepare(ParamStore& params, DType input);
  bool make_onednn_kernel(DType operands);
  void forward_cuda(Workspace& ws, ParamStore& params);  // conv_bias.cu; CUDA builds only
  // W' and b' from host pointers to the params, slot by slot.
  void fold_params(const std::vector<const float*>& slots, std::vector<float>* weight,
                   std::vector<float>* bias) const;
  void check_wiring(const Workspace& ws, const ParamStore& params) const;

  ConvBiasSpec spec_;
  ConvBiasSource source_;
  int out_height_, out_width_;
  std::unique_ptr<Kernels> kernels_;
  // cuda: W' (bf16-rounded, as a bf16 tensor, for a bf16 x) and b' on the device, from
  // parameters of version cuda_version_; cuDNN's state.
  Tensor cuda_weight_, cuda_bias_;
  uint64_t cuda_version_ = 0;
  bool cuda_ready_ = false;
  std::shared_ptr<CudnnConv> cudnn_;
};

}  // namespace ft
