// Vertical fusion of a Linear and the GELU reading its output (the MLP's c_fc -> gelu):
//   pre[rows, out] = x[rows, in] · W[offset : offset + out, :]^T + b[offset : offset + out]
//   y = gelu_tanh(pre)                                              (core/math/gelu_math.h)
// The unfused twin is LinearOp (model/ops/linear.h) -> GeluOp (model/ops/gelu.h);
// fusion/gemm_epilogue_pass.cpp builds this op and tests/fusion_gemm_epilogue_test.cpp checks
// the two agree.
// Training forward walks row tiles of `tile_rows`: one GEMM (bias inside) writes the tile's
// pre-activation into a scratch tile, and GELU runs over it while it is still in cache, writing y
// and keeping gelu'(pre) for backward (oneDNN's GELU post-op returns neither pre nor gelu').
// The sigmoid term both need is computed once, so backward's sweep is a product instead of a
// second evaluation of exp and a division (gpt_small bf16: 6.3 -> 5.7 ms per backward, Zen 4).
// On cuda, cuBLASLt's GELU_AUX epilogue keeps pre itself and the backward kernel takes gelu'.
// Backward, tile by tile:
//   dpre = dy ⊙ gelu'(pre),  dx (+|=) dpre W,  db += colsum(dpre),  then dW += dpre^T x.
// The inference form (eval graphs) is one GEMM with oneDNN's eltwise_gelu_tanh post-op: nothing
// is saved and there is no backward.
// Inputs {x} (may be a column view), outputs {y}, params {weight, bias when has_bias}.
// Thread safety: an op instance belongs to one training thread; GELU tiles run on OpenMP.
#pragma once
#include <cstdint>

#include "core/gemm.h"
#include "core/tensor.h"
#include "model/graph.h"

namespace ft {

// Training forward: y = gelu(pre), pre = x W^T + b, over row tiles of `tile_rows`, each tile's pre
// in `pre_tile` [tile_rows, out] (scratch), gelu'(pre) kept in `gelu_grad` [rows, out] (packed).
// `bias` may be null; strides are floats between rows (0 = packed).
// Out is float, or bf16_bits when y feeds only bf16 GEMMs (fusion/cast_pass.cpp): each element
// is rounded as it leaves the tile, the twin being an fp32 y and a CastOp.
template <typename Out>
void linear_gelu_forward(Out* y, float* gelu_grad, float* pre_tile, GemmOperand x,
                         GemmOperand weight, const float* bias, int64_t rows, int64_t in_features,
                         int64_t out_features, int tile_rows, int64_t y_stride = 0,
                         int64_t x_stride = 0);
// dx (+= or, with overwrite_dx, =) dpre W; dweight += dpre^T x; dbias += colsum(dpre), where
// dpre = dy ⊙ gelu_grad (forward's gelu'(pre)) is written tile by tile into `dpre` [rows, out].
// `dx` and `dbias` may be null (skipped). dx shares x's stride, dy y's. With bf16 x and weight
// (train.precision: bf16) the GEMMs multiply dpre rounded into `dpre_bf16` [rows, out] (null for
// fp32), and `dpre` is not used (may be null): one sweep computes, sums and rounds it.
void linear_gelu_backward(float* dx, bool overwrite_dx, float* dweight, float* dbias, float* dpre,
                          bf16_bits* dpre_bf16, const float* dy, const float* gelu_grad,
                          GemmOperand x, GemmOperand weight, int64_t rows, int64_t in_features,
                          int64_t out_features, int tile_rows, int64_t dy_stride = 0,
                          int64_t x_stride = 0);

// The same on device pointers, enqueued on `stream` (linear_gelu.cu; CUDA builds only), x and
// weight fp32 or both bf16. Forward into an fp32 y is one cuBLASLt GEMM with the GELU_AUX_BIAS
// epilogue (pre written as the aux output, gelu(pre) into y), so no tiling. Forward into a bf16
// y (fusion.vertical.cast) is the GEMM with the bias epilogue into pre, then GeluCastOp's kernel
// y = bf16(gelu(pre)) (fusion/ops/layernorm_cast.h), the CPU tile's rounding. Backward is one
// kernel for dpre = dy ⊙ gelu'(pre) and db += colsum(dpre) (core/cuda/bias_activation_kernel.h),
// in bf16 dpre rounded into `dpre_bf16` (null for fp32, as on the CPU), then the dx and dW GEMMs.
// cuBLASLt's DGELU_BGRAD cannot serve here: it applies to the output of a GEMM, and dy is
// produced by the consumer op.
void linear_gelu_forward_cuda(float* y, float* pre, GemmOperand x, GemmOperand weight,
                              const float* bias, int64_t rows, int64_t in_features,
                              int64_t out_features, int64_t y_stride, int64_t x_stride,
                              CudaStream stream);
void linear_gelu_forward_cuda(bf16_bits* y, float* pre, GemmOperand x, GemmOperand weight,
                              const float* bias, int64_t rows, int64_t in_features,
                              int64_t out_features, int64_t y_stride, int64_t x_stride,
                              CudaStream stream);
void linear_gelu_backward_cuda(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                               float* dpre, bf16_bits* dpre_bf16, const float* dy, const float* pre,
                               GemmOperand x, GemmOperand weight, int64_t rows, int64_t in_features,
                               int64_t out_features, int64_t dy_stride, int64_t x_stride,
                               CudaStream stream);

// How forward produces y; fixed when the pass builds the op from the graph's mode.
enum class LinearGeluForward {
  kTiledKeepPreactivation,  // training: GEMM + GELU per row tile, keeping what backward needs
  kGeluPostOp,              // inference: one GEMM with oneDNN's GELU post-op, no backward
};

class LinearGeluOp : public Op {
 public:
  // REQUIRES: rows, in_features, out_features, tile_rows > 0; weight_row_offset >= 0.
  LinearGeluOp(int64_t rows, int64_t in_features, int64_t out_features, bool has_bias,
               int64_t weight_row_offset, int tile_rows,
               LinearGeluForward forward_kind = LinearGeluForward::kTiledKeepPreactivation);
  OpKind op_kind() const override { return OpKind::kLinearGelu; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  bool supports_views() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int64_t rows() const { return rows_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  int64_t weight_row_offset() const { return weight_row_offset_; }
  int tile_rows() const { return tile_rows_; }
  LinearGeluForward forward_kind() const { return forward_kind_; }
  // What the last training forward kept for backward, [rows, out]: gelu'(x W^T + b) on the CPU,
  // x W^T + b on cuda.
  const Tensor& saved_for_backward() const { return saved_; }

 private:
  int64_t rows_, in_features_, out_features_;
  bool has_bias_;
  int64_t weight_row_offset_;
  int tile_rows_;
  LinearGeluForward forward_kind_;
  Tensor saved_;               // kept by a training forward: gelu'(pre) (CPU) or pre (cuda)
  Tensor preactivation_tile_;  // CPU forward scratch: one row tile of pre [tile_rows, out]
  Tensor dpreactivation_;  // backward scratch, kept so a step allocates nothing (fp32 x or cuda)
  Tensor dpreactivation_bf16_;  // the same rounded to bf16 for bf16 GEMMs
};

}  // namespace ft
