// Vertical fusion of LayerNorm -> cast under train.precision: bf16: each row is normalised into
// an L1-resident row buffer and written to y in bf16, so the fp32 output never reaches memory
// and the cast op's read of it disappears:
//   y[r] = bf16((x[r] - mean_r) * rstd_r * weight + bias)     (kernels/layernorm_math.h)
// The unfused twin is LayerNormOp (model/ops/layernorm.h) -> CastOp (model/ops/cast.h);
// fusion/cast_pass.cpp builds this op and tests/precision_test.cpp checks the two agree bit for
// bit (the same row math, rounded once). Backward is LayerNorm's: it reads x, the saved
// statistics and the fp32 gradient of y.
// Inputs {x fp32}, outputs {y bf16}, either a column view; params {weight [C], bias [C]}.
// CUDA (layernorm_cast.cu): LayerNorm's warp-per-row kernel writing bf16
// (fusion/ops/layernorm_bf16_row.cuh); backward is LayerNorm's CUDA backward.
// Thread safety: an op instance belongs to one training thread; rows run on OpenMP.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/math/bf16_math.h"
#include "model/graph.h"

namespace ft {

// CUDA launchers (layernorm_cast.cu; CUDA builds only), on device pointers, enqueued on `stream`;
// strides are elements between rows (0 = packed).
// y = bf16(LayerNorm(x)) over [rows, channels], with the row statistics written to mean and rstd
// [rows] as LayerNorm's forward saves them.
void layernorm_cast_forward_cuda(bf16_bits* y, float* mean, float* rstd, const float* x,
                                 const float* weight, const float* bias, int64_t rows,
                                 int64_t channels, int64_t y_stride, int64_t x_stride,
                                 CudaStream stream);
// y[r, c] = bf16(gelu_tanh(x[r, c])) over [rows, cols]: GeluCastOp's forward (one row of numel),
// and LinearGeluOp's bf16 output from its pre-activation (fusion/ops/linear_gelu.h).
void gelu_cast_forward_cuda(bf16_bits* y, const float* x, int64_t rows, int64_t cols,
                            int64_t y_stride, int64_t x_stride, CudaStream stream);

class LayerNormCastOp : public Op {
 public:
  LayerNormCastOp(int64_t rows, int64_t channels);
  OpKind op_kind() const override { return OpKind::kLayerNormCast; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool supports_views() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  int64_t rows_, channels_;
  Tensor mean_, rstd_;         // [rows] on the workspace's device, written by forward
  Tensor param_grad_scratch_;  // cuda: the column partials of the weight and bias gradients
};

// Vertical fusion of GELU -> cast: y = bf16(gelu_tanh(x)) in one pass (core/math/gelu_math.h). The
// twin is GeluOp -> CastOp; backward is GELU's (dx += dy gelu'(x), reading x and the fp32 dy),
// on cuda its kernel (kernels/gelu.h).
// Inputs {x fp32}, outputs {y bf16}, no params.
class GeluCastOp : public Op {
 public:
  explicit GeluCastOp(int64_t numel);
  OpKind op_kind() const override { return OpKind::kGeluCast; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

 private:
  int64_t numel_;
};

}  // namespace ft
