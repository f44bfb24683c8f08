// LayerNorm over the last axis: y[r] = (x[r] - mean_r) * rstd_r * weight + bias, eps 1e-5.
// Inputs {x [rows, C]}, outputs {y [rows, C]} (either may be a column view), params
// {weight [C], bias [C]}.
// Forward saves mean and rstd per row for backward.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>
#include <vector>

#include "model/graph.h"

namespace ft {

// Strides are floats between rows (0 = channels): views such as one head's columns of q.
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t rows, int64_t channels, int64_t y_stride = 0,
                       int64_t x_stride = 0);
// dx += ...; dweight += ...; dbias += ... (see model/ops/layernorm_math.h for the math).
// dx shares x's stride, dy y's.
void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                        const float* weight, const float* mean, const float* rstd, int64_t rows,
                        int64_t channels, int64_t dy_stride = 0, int64_t x_stride = 0);

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

  const std::vector<float>& mean() const { return mean_; }
  const std::vector<float>& rstd() const { return rstd_; }

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  int64_t rows_, channels_;
  std::vector<float> mean_, rstd_;  // [rows], written by forward
};

}  // namespace ft
