// LayerNormOp: the wiring around the LayerNorm kernels of kernels/layernorm.h (CPU and CUDA).
#include "model/ops/layernorm.h"

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

LayerNormOp::LayerNormOp(int64_t rows, int64_t channels) : rows_(rows), channels_(channels) {
  FT_CHECK(rows > 0 && channels > 0, "LayerNormOp: non-positive shape rows=", rows,
           " channels=", channels);
}

void LayerNormOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 1, 1, 2);
  expect_numel(ws.values[inputs[0]], rows_ * channels_, *this, "input x");
  expect_numel(ws.values[outputs[0]], rows_ * channels_, *this, "output y");
  expect_numel(params[this->params[0]].value, channels_, *this, "weight");
  expect_numel(params[this->params[1]].value, channels_, *this, "bias");
}

void LayerNormOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  reuse_or_allocate(mean_, rows_, ws.device);
  reuse_or_allocate(rstd_, rows_, ws.device);
  float* y = ws.values[outputs[0]].data();
  const float* x = ws.values[inputs[0]].data();
  const float* weight = params[this->params[0]].value.data();
  const float* bias = params[this->params[1]].value.data();
  const int64_t y_stride = ws.row_stride(outputs[0]), x_stride = ws.row_stride(inputs[0]);
  FT_RUN_ON_CUDA(ws, layernorm_forward_cuda(y, mean_.data(), rstd_.data(), x, weight, bias, rows_,
                                            channels_, y_stride, x_stride, ws.stream));
  layernorm_forward(y, mean_.data(), rstd_.data(), x, weight, bias, rows_, channels_, y_stride,
                    x_stride);
}

void layernorm_op_backward(const Op& op, Workspace& ws, ParamStore& params, int64_t rows,
                           int64_t channels, const Tensor& mean, const Tensor& rstd,
                           Tensor& param_grad_scratch) {
  FT_CHECK(mean.numel() == rows && mean.device() == ws.device, op.kind(), " '", op.name,
           "': backward before forward");
  float* dx = ws.grads[op.inputs[0]].data();
  float* dweight = params[op.params[0]].grad.data();
  float* dbias = params[op.params[1]].grad.data();
  const float* dy = ws.grads[op.outputs[0]].data();
  const float* x = ws.values[op.inputs[0]].data();
  const float* weight = params[op.params[0]].value.data();
  const int64_t dy_stride = ws.row_stride(op.outputs[0]), x_stride = ws.row_stride(op.inputs[0]);
  if (ws.device == Device::kCuda)
    reuse_or_allocate(param_grad_scratch, layernorm_params_scratch_floats(1, rows, channels),
                      ws.device);
  FT_RUN_ON_CUDA(ws, layernorm_backward_cuda(dx, dweight, dbias, param_grad_scratch.data(), dy, x,
                                             weight, mean.data(), rstd.data(), rows, channels,
                                             dy_stride, x_stride, ws.stream));
  layernorm_backward(dx, dweight, dbias, dy, x, weight, mean.data(), rstd.data(), rows, channels,
                     dy_stride, x_stride);
}

void LayerNormOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  layernorm_op_backward(*this, ws, params, rows_, channels_, mean_, rstd_, param_grad_scratch_);
}

OpCost LayerNormOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double elements = static_cast<double>(rows_ * channels_);
  cost.forward_flops = 8 * elements;    // mean, variance, normalise, scale and shift
  cost.backward_flops = 14 * elements;  // the two row means, dx, dweight, dbias
  cost.bytes_read += 8.0 * channels_;
  cost.saved_bytes = 8.0 * rows_;
  return cost;
}

}  // namespace ft
