// Horizontal fusion of `count` independent LayerNorms of one shape (the 2·n_head per-head q/k
// LayerNorms of qk_norm) into one launch: for each n,
//   y_n[r] = (x_n[r] - mean) * rstd * w_n + b_n   over `channels` columns, eps 1e-5,
// exactly as LayerNormOp (model/ops/layernorm.h), its unfused twin, with the same row math
// (kernels/layernorm_math.h, which also derives dx). Forward and the input gradient run as
// one parallel loop over all count × rows rows; dw_n += sum_r dy_n xhat_n and db_n += sum_r dy_n
// are summed serially, LayerNorm by LayerNorm in the order the unfused chain's backward visits
// them (last op first), so a weight shared by every head gets bit-for-bit the unfused gradient.
// Inputs {x_0 .. x_{count-1}}, outputs {y_0 .. y_{count-1}}, each [rows, channels], possibly a
// column view; params {w_0, b_0, w_1, b_1, ...}, where pairs may name the same parameters.
// On cuda the same table of LayerNorms goes to kernels/layernorm.cu's batched kernels (one
// launch per 32 LayerNorms); their parameter gradients are also added last LayerNorm first.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>
#include <vector>

#include "model/graph.h"

namespace ft {

class BatchedLayerNormOp : public Op {
 public:
  // REQUIRES: rows, channels, count > 0.
  BatchedLayerNormOp(int64_t rows, int64_t channels, int count);
  OpKind op_kind() const override { return OpKind::kBatchedLayerNorm; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool supports_views() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int64_t rows() const { return rows_; }
  int64_t channels() const { return channels_; }
  int count() const { return count_; }

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  void forward_cuda(Workspace& ws, ParamStore& params);
  void backward_cuda(Workspace& ws, ParamStore& params);

  int64_t rows_, channels_;
  int count_;
  // [count * rows] on the workspace's device: LayerNorm n's rows at n * rows.
  Tensor mean_, rstd_;
  Tensor param_grad_scratch_;  // cuda: the column partials of the weight and bias gradients
};

}  // namespace ft
