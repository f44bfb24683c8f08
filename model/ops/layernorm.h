// LayerNorm over the last axis: y[r] = (x[r] - mean_r) * rstd_r * weight + bias, eps 1e-5.
// Inputs {x [rows, C]}, outputs {y [rows, C]} (either may be a column view), params
// {weight [C], bias [C]}.
// Forward saves mean and rstd per row for backward, on the workspace's device. The math is in
// kernels/layernorm.h (CPU and CUDA), which fusion/'s LayerNorm ops call too.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/layernorm.h"
#include "model/graph.h"

namespace ft {

// The backward of an op whose output is LayerNorm(inputs[0]) with params {weight, bias}: dx,
// dweight and dbias += from the fp32 gradient of outputs[0], x and the statistics its forward
// saved, on ws.device (param_grad_scratch is sized here on cuda). LayerNormOp's backward, and
// LayerNormCastOp's (fusion/ops/layernorm_cast.h), whose output is the same row rounded to bf16.
// REQUIRES: op's wiring checked (1 input, 1 output, 2 params of rows x channels).
void layernorm_op_backward(const Op& op, Workspace& ws, ParamStore& params, int64_t rows,
                           int64_t channels, const Tensor& mean, const Tensor& rstd,
                           Tensor& param_grad_scratch);

class LayerNormOp : public Op {
 public:
  LayerNormOp(int64_t rows, int64_t channels);
  OpKind op_kind() const override { return OpKind::kLayerNorm; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool supports_views() const override { return true; }
  OpCost cost(const Graph& graph) const override;
  int64_t rows() const { return rows_; }
  int64_t channels() const { return channels_; }

  // Host copies of the statistics the last forward saved.
  std::vector<float> mean() const { return mean_.to_host_vector(); }
  std::vector<float> rstd() const { return rstd_.to_host_vector(); }

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  int64_t rows_, channels_;
  Tensor mean_, rstd_;         // [rows] on the workspace's device, written by forward
  Tensor param_grad_scratch_;  // cuda: the column partials of the weight and bias gradients
};

}  // namespace ft
