// One GEMM for q, k and v: the Linear math of model/ops/linear.h over the concatenated row
// blocks of the shared weight, so x is read once and oneDNN sees one N = 3C problem.
#include "fusion/ops/qkv_linear.h"

#include "core/check.h"
#include "model/ops/linear.h"

namespace ft {

QkvLinearOp::QkvLinearOp(int64_t rows, int64_t in_features, int64_t width, int count, bool has_bias,
                         int64_t weight_row_offset)
    : rows_(rows),
      in_features_(in_features),
      width_(width),
      count_(count),
      has_bias_(has_bias),
      weight_row_offset_(weight_row_offset) {
  FT_CHECK(rows > 0 && in_features > 0 && width > 0 && count > 0,
           "QkvLinearOp: non-positive shape rows=", rows, " in=", in_features, " width=", width,
           " count=", count);
  FT_CHECK(weight_row_offset >= 0, "QkvLinearOp: negative weight row offset ", weight_row_offset);
}

void QkvLinearOp::forward(Workspace& ws, ParamStore& params) {
  linear_op_forward(*this, ws, params, rows_, in_features_, out_features(), has_bias_,
                    weight_row_offset_);
}

void QkvLinearOp::backward(Workspace& ws, ParamStore& params) {
  linear_op_backward(*this, ws, params, rows_, in_features_, out_features(), has_bias_,
                     weight_row_offset_);
}

OpCost QkvLinearOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(rows_) * in_features_ * out_features();
  cost.forward_flops = 2 * macs;
  cost.backward_flops = 4 * macs;
  cost.bytes_read += 4.0 * out_features() * (in_features_ + (has_bias_ ? 1 : 0));
  return cost;
}

}  // namespace ft
