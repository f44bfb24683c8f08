// Linear layer: y = x W^T + b, with W in nn.Linear layout [out, in]. All three matmuls go through
// oneDNN (core/gemm.h); the transposes are expressed as layout flags, never materialised.
#include "model/ops/linear.h"

#include <vector>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/gemm.h"
#include "model/ops/op_checks.h"

namespace ft {

GemmOperand weight_operand(const Param& weight, int64_t offset, DType x_dtype) {
  if (x_dtype == DType::kF32) return weight.value.data() + offset;
  FT_CHECK(weight.bf16_value.numel() > 0, "parameter '", weight.name,
           "' has no bf16 copy, but a bf16 GEMM reads it (train.precision: bf16 needs "
           "ParamStore::enable_bf16_copies before allocate)");
  return weight.bf16_value.bf16_data() + offset;
}

GemmOperand value_operand(const Tensor& value) {
  if (value.dtype() == DType::kBF16) return value.bf16_data();
  return value.data();
}

const bf16_bits* bf16_gradient_copy(const float* dy, int64_t rows, int64_t cols,
                                    int64_t dy_stride) {
  static thread_local std::vector<bf16_bits> copy;
  copy.resize(static_cast<size_t>(rows * cols));
  cast_rows_to_bf16(copy.data(), cols, dy, dy_stride, rows, cols);
  return copy.data();
}

void linear_backward_bf16(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                          const float* dy, const bf16_bits* x, const bf16_bits* weight,
                          int64_t rows, int64_t in_features, int64_t out_features,
                          int64_t dy_stride, int64_t x_stride) {
  if (dy_stride == 0) dy_stride = out_features;
  const bf16_bits* dy_bf16 = bf16_gradient_copy(dy, rows, out_features, dy_stride);
  if (dx != nullptr)
    gemm(dx, dy_bf16, weight,
         linear_dx_gemm(rows, in_features, out_features, out_features, x_stride, overwrite_dx));
  gemm(dweight, dy_bf16, x,
       linear_dweight_gemm(rows, in_features, out_features, out_features, x_stride));
  if (dbias != nullptr) {
    for (int64_t row = 0; row < rows; ++row) {
      const float* dy_row = dy + row * dy_stride;
      for (int64_t o = 0; o < out_features; ++o) dbias[o] += dy_row[o];
    }
  }
}

GemmArgs linear_forward_gemm(int64_t rows, int64_t in_features, int64_t out_features,
                             const float* bias, int64_t y_stride, int64_t x_stride) {
  GemmArgs args;
  args.m = rows;
  args.n = out_features;
  args.k = in_features;
  args.lda = x_stride;
  args.ldc = y_stride;
  args.transpose_b = true;  // W is stored [out, in] = [N, K]
  args.bias = bias;
  return args;
}

GemmArgs linear_dx_gemm(int64_t rows, int64_t in_features, int64_t out_features, int64_t dy_stride,
                        int64_t x_stride, bool overwrite_dx) {
  GemmArgs args;
  args.m = rows;
  args.n = in_features;
  args.k = out_features;
  args.lda = dy_stride;
  args.ldc = x_stride;
  args.accumulate = !overwrite_dx;
  return args;
}

GemmArgs linear_dweight_gemm(int64_t rows, int64_t in_features, int64_t out_features,
                             int64_t dy_stride, int64_t x_stride) {
  GemmArgs args;
  args.m = out_features;
  args.n = in_features;
  args.k = rows;
  args.transpose_a = true;
  args.lda = dy_stride;
  args.ldb = x_stride;
  args.accumulate = true;
  return args;
}

void linear_forward(float* y, const float* x, const float* weight, const float* bias, int64_t rows,
                    int64_t in_features, int64_t out_features, int64_t y_stride, int64_t x_stride) {
  gemm(y, x, weight,
       linear_forward_gemm(rows, in_features, out_features, bias, y_stride, x_stride));
}

void linear_backward(float* dx, bool overwrite_dx, float* dweight, float* dbias, const float* dy,
                     const float* x, const float* weight, int64_t rows, int64_t in_features,
                     int64_t out_features, int64_t dy_stride, int64_t x_stride) {
  if (dy_stride == 0) dy_stride = out_features;
  if (dx != nullptr)
    gemm(dx, dy, weight,
         linear_dx_gemm(rows, in_features, out_features, dy_stride, x_stride, overwrite_dx));
  gemm(dweight, dy, x, linear_dweight_gemm(rows, in_features, out_features, dy_stride, x_stride));
  // y = ... + b broadcast over rows  =>  db = sum over rows of dy
  if (dbias != nullptr) {
    for (int64_t row = 0; row < rows; ++row) {
      const float* dy_row = dy + row * dy_stride;
      for (int64_t o = 0; o < out_features; ++o) dbias[o] += dy_row[o];
    }
  }
}

LinearOp::LinearOp(int64_t rows, int64_t in_features, int64_t out_features, bool has_bias,
                   int64_t weight_row_offset)
    : rows_(rows),
      in_features_(in_features),
      out_features_(out_features),
      has_bias_(has_bias),
      weight_row_offset_(weight_row_offset) {
  FT_CHECK(rows > 0 && in_features > 0 && out_features > 0,
           "LinearOp: non-positive shape rows=", rows, " in=", in_features, " out=", out_features);
  FT_CHECK(weight_row_offset >= 0, "LinearOp: negative weight row offset ", weight_row_offset);
}

void check_linear_wiring(const Op& op, const Workspace& ws, const ParamStore& params, int64_t rows,
                         int64_t in_features, int64_t out_features, bool has_bias,
                         int64_t weight_row_offset) {
  expect_arity(op, 1, 1, has_bias ? 2 : 1);
  expect_numel(ws.values[op.inputs[0]], rows * in_features, op, "input x");
  expect_numel(ws.values[op.outputs[0]], rows * out_features, op, "output y");
  const int64_t end_row = weight_row_offset + out_features;
  const Tensor& weight = params[op.params[0]].value;
  FT_CHECK(weight.numel() >= end_row * in_features, op.kind(), " '", op.name, "': weight ",
           shape_str(weight.shape()), " has no rows [", weight_row_offset, ", ", end_row, ") of ",
           in_features, " columns");
  if (has_bias)
    FT_CHECK(params[op.params[1]].value.numel() >= end_row, op.kind(), " '", op.name,
             "': bias too short for rows [", weight_row_offset, ", ", end_row, ")");
}

void linear_op_forward(const Op& op, Workspace& ws, ParamStore& params, int64_t rows,
                       int64_t in_features, int64_t out_features, bool has_bias,
                       int64_t weight_row_offset) {
  check_linear_wiring(op, ws, params, rows, in_features, out_features, has_bias, weight_row_offset);
  const int64_t offset = weight_row_offset;
  const float* bias = has_bias ? params[op.params[1]].value.data() + offset : nullptr;
  const Tensor& x = ws.values[op.inputs[0]];
  if (x.dtype() == DType::kBF16) {
    float* y = ws.values[op.outputs[0]].data();
    const GemmOperand weight =
        weight_operand(params[op.params[0]], offset * in_features, DType::kBF16);
    const int64_t y_stride = ws.row_stride(op.outputs[0]), x_stride = ws.row_stride(op.inputs[0]);
    FT_RUN_ON_CUDA(ws, linear_forward_cuda(y, x.bf16_data(), weight, bias, rows, in_features,
                                           out_features, y_stride, x_stride, ws.stream));
    gemm(y, x.bf16_data(), weight,
         linear_forward_gemm(rows, in_features, out_features, bias, y_stride, x_stride));
    return;
  }
  FT_RUN_ON_CUDA(
      ws, linear_forward_cuda(ws.values[op.outputs[0]].data(), ws.values[op.inputs[0]].data(),
                              params[op.params[0]].value.data() + offset * in_features, bias, rows,
                              in_features, out_features, ws.row_stride(op.outputs[0]),
                              ws.row_stride(op.inputs[0]), ws.stream));
  linear_forward(ws.values[op.outputs[0]].data(), ws.values[op.inputs[0]].data(),
                 params[op.params[0]].value.data() + offset * in_features, bias, rows, in_features,
                 out_features, ws.row_stride(op.outputs[0]), ws.row_stride(op.inputs[0]));
}

void linear_op_backward(const Op& op, Workspace& ws, ParamStore& params, int64_t rows,
                        int64_t in_features, int64_t out_features, bool has_bias,
                        int64_t weight_row_offset) {
  check_linear_wiring(op, ws, params, rows, in_features, out_features, has_bias, weight_row_offset);
  const int64_t offset = weight_row_offset;
  float* dbias = has_bias ? params[op.params[1]].grad.data() + offset : nullptr;
  Tensor& dx = ws.grads[op.inputs[0]];
  const bool overwrite_dx = ws.grad_is_fresh(op.inputs[0]);
  const Tensor& x = ws.values[op.inputs[0]];
  if (x.dtype() == DType::kBF16) {
    float* dx_data = dx.defined() && dx.numel() > 0 ? dx.data() : nullptr;
    float* dweight = params[op.params[0]].grad.data() + offset * in_features;
    const float* dy = ws.grads[op.outputs[0]].data();
    const auto* weight = static_cast<const bf16_bits*>(
        weight_operand(params[op.params[0]], offset * in_features, DType::kBF16).data);
    const int64_t dy_stride = ws.row_stride(op.outputs[0]), x_stride = ws.row_stride(op.inputs[0]);
    FT_RUN_ON_CUDA(ws, linear_backward_bf16_cuda(dx_data, overwrite_dx, dweight, dbias, dy,
                                                 x.bf16_data(), weight, rows, in_features,
                                                 out_features, dy_stride, x_stride, ws.stream));
    linear_backward_bf16(dx_data, overwrite_dx, dweight, dbias, dy, x.bf16_data(), weight, rows,
                         in_features, out_features, dy_stride, x_stride);
    return;
  }
  FT_RUN_ON_CUDA(
      ws, linear_backward_cuda(dx.defined() && dx.numel() > 0 ? dx.data() : nullptr, overwrite_dx,
                               params[op.params[0]].grad.data() + offset * in_features, dbias,
                               ws.grads[op.outputs[0]].data(), ws.values[op.inputs[0]].data(),
                               params[op.params[0]].value.data() + offset * in_features, rows,
                               in_features, out_features, ws.row_stride(op.outputs[0]),
                               ws.row_stride(op.inputs[0]), ws.stream));
  linear_backward(dx.defined() && dx.numel() > 0 ? dx.data() : nullptr, overwrite_dx,
                  params[op.params[0]].grad.data() + offset * in_features, dbias,
                  ws.grads[op.outputs[0]].data(), ws.values[op.inputs[0]].data(),
                  params[op.params[0]].value.data() + offset * in_features, rows, in_features,
                  out_features, ws.row_stride(op.outputs[0]), ws.row_stride(op.inputs[0]));
}

void LinearOp::forward(Workspace& ws, ParamStore& params) {
  linear_op_forward(*this, ws, params, rows_, in_features_, out_features_, has_bias_,
                    weight_row_offset_);
}

void LinearOp::backward(Workspace& ws, ParamStore& params) {
  linear_op_backward(*this, ws, params, rows_, in_features_, out_features_, has_bias_,
                     weight_row_offset_);
}

OpCost LinearOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(rows_) * in_features_ * out_features_;
  cost.forward_flops = 2 * macs;
  cost.backward_flops = 4 * macs;
  // The weight as the GEMM reads it: its bf16 copy when x is bf16; the bias stays fp32.
  cost.bytes_read += graph.element_bytes(inputs[0]) * out_features_ * in_features_ +
                     (has_bias_ ? 4.0 * out_features_ : 0.0);
  return cost;
}

}  // namespace ft
