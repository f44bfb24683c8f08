// One GEMM for q, k and v: the Linear math of model/ops/linear.h over the concatenated row
// blocks of the shared weight, so x is read once and oneDNN sees one N = 3C problem.
#include "fusion/ops/qkv_linear.h"

#include "core/check.h"
#include "model/ops/linear.h"
#include "model/ops/op_checks.h"

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

void QkvLinearOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 1, 1, has_bias_ ? 2 : 1);
  expect_numel(ws.values[inputs[0]], rows_ * in_features_, *this, "input x");
  expect_numel(ws.values[outputs[0]], rows_ * out_features(), *this, "output y");
  const int64_t end_row = weight_row_offset_ + out_features();
  FT_CHECK(params[this->params[0]].value.numel() >= end_row * in_features_, kind(), " '", name,
           "': weight ", shape_str(params[this->params[0]].value.shape()), " has no rows [",
           weight_row_offset_, ", ", end_row, ") of ", in_features_, " columns");
  if (has_bias_)
    FT_CHECK(params[this->params[1]].value.numel() >= end_row, kind(), " '", name,
             "': bias too short for rows [", weight_row_offset_, ", ", end_row, ")");
}

void QkvLinearOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const int64_t offset = weight_row_offset_;
  const float* bias = has_bias_ ? params[this->params[1]].value.data() + offset : nullptr;
  linear_forward(ws.values[outputs[0]].data(), ws.values[inputs[0]].data(),
                 params[this->params[0]].value.data() + offset * in_features_, bias, rows_,
                 in_features_, out_features(), ws.row_stride(outputs[0]), ws.row_stride(inputs[0]));
}

void QkvLinearOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const int64_t offset = weight_row_offset_;
  float* dbias = has_bias_ ? params[this->params[1]].grad.data() + offset : nullptr;
  Tensor& dx = ws.grads[inputs[0]];
  linear_backward(dx.defined() && dx.numel() > 0 ? dx.data() : nullptr,
                  params[this->params[0]].grad.data() + offset * in_features_, dbias,
                  ws.grads[outputs[0]].data(), ws.values[inputs[0]].data(),
                  params[this->params[0]].value.data() + offset * in_features_, rows_, in_features_,
                  out_features(), ws.row_stride(outputs[0]), ws.row_stride(inputs[0]));
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
