// One GEMM for q, k and v: the Linear math of model/ops/linear.h over the concatenated row
// blocks of the shared weight, so x is read once and oneDNN sees one N = 3C problem.
#include "fusion/ops/qkv_linear.h"

#include <omp.h>

#include <algorithm>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/gemm.h"
#include "model/ops/cast.h"
#include "model/ops/linear.h"
#include "model/ops/op_checks.h"

namespace ft {

QkvLinearOp::QkvLinearOp(int64_t rows, int64_t in_features, int64_t width, int count, bool has_bias,
                         int64_t weight_row_offset, int64_t bf16_tile_rows)
    : rows_(rows),
      in_features_(in_features),
      width_(width),
      count_(count),
      has_bias_(has_bias),
      weight_row_offset_(weight_row_offset),
      bf16_tile_rows_(std::min(bf16_tile_rows, rows)) {
  FT_CHECK(rows > 0 && in_features > 0 && width > 0 && count > 0,
           "QkvLinearOp: non-positive shape rows=", rows, " in=", in_features, " width=", width,
           " count=", count);
  FT_CHECK(weight_row_offset >= 0, "QkvLinearOp: negative weight row offset ", weight_row_offset);
  FT_CHECK(bf16_tile_rows >= 1, "QkvLinearOp: bf16_tile_rows ", bf16_tile_rows,
           " must be at least 1");
}

void QkvLinearOp::forward(Workspace& ws, ParamStore& params) {
  if (ws.values[outputs[0]].dtype() == DType::kBF16) return forward_into_bf16(ws, params);
  linear_op_forward(*this, ws, params, rows_, in_features_, out_features(), has_bias_,
                    weight_row_offset_);
}

void QkvLinearOp::forward_into_bf16(Workspace& ws, ParamStore& params) {
  check_linear_wiring(*this, ws, params, rows_, in_features_, out_features(), has_bias_,
                      weight_row_offset_);
  const Tensor& x = ws.values[inputs[0]];
  FT_CHECK(x.dtype() == DType::kBF16, kind(), " '", name,
           "': a bf16 output needs the bf16 input of train.precision: bf16");
  const int64_t out = out_features(), x_stride = ws.row_stride(inputs[0]);
  const int64_t y_stride = ws.row_stride(outputs[0]);
  bf16_bits* y = ws.values[outputs[0]].bf16_data();
  const float* bias =
      has_bias_ ? params[this->params[1]].value.data() + weight_row_offset_ : nullptr;
  const GemmOperand weight =
      weight_operand(params[this->params[0]], weight_row_offset_ * in_features_, DType::kBF16);
  const bool on_cuda = ws.device == Device::kCuda;
  if (!on_cuda && bf16_gemm_native()) {
    // oneDNN rounds C to bf16 as it stores it, so no fp32 rows are written (the bits are those
    // of the tiles below: the same fp32 sums, rounded to nearest even).
    return gemm_bf16_output(
        y, x.bf16_data(), weight,
        linear_forward_gemm(rows_, in_features_, out, bias, y_stride, x_stride));
  }
  const int64_t tile_rows = on_cuda ? rows_ : bf16_tile_rows_;
  reuse_or_allocate(fp32_tile_, tile_rows * out, ws.device);
  float* fp32_rows = fp32_tile_.data();
  FT_RUN_ON_CUDA(ws, {
    linear_forward_cuda(fp32_rows, x.bf16_data(), weight, bias, rows_, in_features_, out, out,
                        x_stride, ws.stream);
    cast_forward_cuda(y, fp32_rows, rows_, out, y_stride, out, ws.stream);
  });
  for (int64_t first = 0; first < rows_; first += tile_rows) {
    const int64_t tile = std::min(tile_rows, rows_ - first);
    gemm(fp32_rows, x.bf16_data() + first * x_stride, weight,
         linear_forward_gemm(tile, in_features_, out, bias, out, x_stride));
    cast_rows_to_bf16(y + first * y_stride, y_stride, fp32_rows, out, tile, out);
  }
}

void QkvLinearOp::backward_bf16_cpu(Workspace& ws, ParamStore& params) {
  check_linear_wiring(*this, ws, params, rows_, in_features_, out_features(), has_bias_,
                      weight_row_offset_);
  const int64_t out = out_features(), dy_stride = ws.row_stride(outputs[0]);
  const float* dy = ws.grads[outputs[0]].data();
  float* dbias = has_bias_ ? params[this->params[1]].grad.data() + weight_row_offset_ : nullptr;
  dy_bf16_.resize(static_cast<size_t>(rows_ * out));
  bf16_bits* rounded = dy_bf16_.data();
  // Threads split columns, so db sums each column in row order, as LinearOp's loop does.
  const int team = rows_ * out >= (1 << 16) ? omp_get_max_threads() : 1;
  const int64_t chunk = (out + team - 1) / team;
#pragma omp parallel for num_threads(team) if (team > 1)
  for (int part = 0; part < team; ++part) {
    const int64_t begin = part * chunk, end = std::min(out, begin + chunk);
    for (int64_t row = 0; row < rows_; ++row) {
      const float* dy_row = dy + row * dy_stride;
      bf16_bits* rounded_row = rounded + row * out;
      if (dbias == nullptr) {
        store_row_bf16(rounded_row + begin, dy_row + begin, std::max<int64_t>(end - begin, 0));
        continue;
      }
#pragma omp simd
      for (int64_t o = begin; o < end; ++o) {
        rounded_row[o] = float_to_bf16(dy_row[o]);
        dbias[o] += dy_row[o];
      }
    }
  }
  const Tensor& x = ws.values[inputs[0]];
  const int64_t x_stride = ws.row_stride(inputs[0]);
  const GemmOperand weight =
      weight_operand(params[this->params[0]], weight_row_offset_ * in_features_, DType::kBF16);
  Tensor& dx = ws.grads[inputs[0]];
  if (dx.defined() && dx.numel() > 0)
    gemm(dx.data(), rounded, weight,
         linear_dx_gemm(rows_, in_features_, out, out, x_stride, ws.grad_is_fresh(inputs[0])));
  gemm(params[this->params[0]].grad.data() + weight_row_offset_ * in_features_, rounded,
       x.bf16_data(), linear_dweight_gemm(rows_, in_features_, out, out, x_stride));
}

void QkvLinearOp::backward(Workspace& ws, ParamStore& params) {
  if (ws.device == Device::kCpu && ws.values[inputs[0]].dtype() == DType::kBF16)
    return backward_bf16_cpu(ws, params);
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
