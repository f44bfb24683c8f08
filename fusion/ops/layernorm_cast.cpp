#include "fusion/ops/layernorm_cast.h"

#include <vector>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/math/gelu_math.h"
#include "kernels/gelu.h"
#include "kernels/layernorm_math.h"
#include "model/ops/layernorm.h"
#include "model/ops/op_checks.h"

namespace ft {

LayerNormCastOp::LayerNormCastOp(int64_t rows, int64_t channels)
    : rows_(rows), channels_(channels) {
  FT_CHECK(rows > 0 && channels > 0, "LayerNormCastOp: non-positive shape rows=", rows,
           " channels=", channels);
}

void LayerNormCastOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 1, 1, 2);
  expect_numel(ws.values[inputs[0]], rows_ * channels_, *this, "input x");
  expect_numel(ws.values[outputs[0]], rows_ * channels_, *this, "output y");
  expect_numel(params[this->params[0]].value, channels_, *this, "weight");
  expect_numel(params[this->params[1]].value, channels_, *this, "bias");
}

void LayerNormCastOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  reuse_or_allocate(mean_, rows_, ws.device);
  reuse_or_allocate(rstd_, rows_, ws.device);
  bf16_bits* y = ws.values[outputs[0]].bf16_data();
  const float* x = ws.values[inputs[0]].data();
  const float* weight = params[this->params[0]].value.data();
  const float* bias = params[this->params[1]].value.data();
  const int64_t y_stride = ws.row_stride(outputs[0]), x_stride = ws.row_stride(inputs[0]);
  float* mean = mean_.data();
  float* rstd = rstd_.data();
  FT_RUN_ON_CUDA(ws, layernorm_cast_forward_cuda(y, mean, rstd, x, weight, bias, rows_, channels_,
                                                 y_stride, x_stride, ws.stream));
  const int64_t C = channels_;
#pragma omp parallel if (rows_ * C > 65536)
  {
    std::vector<float> row_buffer(static_cast<size_t>(C));
#pragma omp for
    for (int64_t row = 0; row < rows_; ++row) {
      layernorm_row_forward(row_buffer.data(), mean + row, rstd + row, x + row * x_stride, weight,
                            bias, C, kLayerNormEps);
      store_row_bf16(y + row * y_stride, row_buffer.data(), C);
    }
  }
}

void LayerNormCastOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  layernorm_op_backward(*this, ws, params, rows_, channels_, mean_, rstd_, param_grad_scratch_);
}

// LayerNorm's FLOPs; the fp32 output's write and the cast's read of it are gone.
OpCost LayerNormCastOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double elements = static_cast<double>(rows_) * channels_;
  cost.forward_flops = 8 * elements;
  cost.backward_flops = 14 * elements;
  cost.bytes_read += 8.0 * channels_;
  cost.saved_bytes = 8.0 * rows_;
  return cost;
}

GeluCastOp::GeluCastOp(int64_t numel) : numel_(numel) {
  FT_CHECK(numel > 0, "GeluCastOp: non-positive numel ", numel);
}

void GeluCastOp::forward(Workspace& ws, ParamStore&) {
  expect_arity(*this, 1, 1, 0);
  expect_numel(ws.values[inputs[0]], numel_, *this, "input x");
  expect_numel(ws.values[outputs[0]], numel_, *this, "output y");
  bf16_bits* y = ws.values[outputs[0]].bf16_data();
  const float* x = ws.values[inputs[0]].data();
  FT_RUN_ON_CUDA(ws, gelu_cast_forward_cuda(y, x, 1, numel_, 0, 0, ws.stream));
  // Not `parallel for simd if (...)`: GCC 12 leaves that construct's serial branch unvectorised
  // (core/bf16_cast.cpp).
  if (numel_ <= 262144) {
#pragma omp simd
    for (int64_t i = 0; i < numel_; ++i) y[i] = float_to_bf16(gelu_tanh(x[i]));
    return;
  }
#pragma omp parallel for simd
  for (int64_t i = 0; i < numel_; ++i) y[i] = float_to_bf16(gelu_tanh(x[i]));
}

void GeluCastOp::backward(Workspace& ws, ParamStore&) {
  float* dx = ws.grads[inputs[0]].data();
  const float* dy = ws.grads[outputs[0]].data();
  const float* x = ws.values[inputs[0]].data();
  FT_RUN_ON_CUDA(ws, gelu_backward_cuda(dx, dy, x, numel_, ws.stream));
  gelu_backward(dx, dy, x, numel_);
}

OpCost GeluCastOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  cost.forward_flops = 20 * static_cast<double>(numel_);
  cost.backward_flops = 30 * static_cast<double>(numel_);
  return cost;
}

}  // namespace ft
