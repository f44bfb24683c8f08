// LinearResidualLayerNormOp (see linear_residual_layernorm.h): the projection's GEMM one row tile
// at a time into a cache-sized scratch, ResidualLayerNormOp's row loops on it; backward the same
// tiles in reverse roles.
#include "fusion/ops/linear_residual_layernorm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/gemm.h"
#include "fusion/ops/residual_layernorm.h"
#include "kernels/layernorm.h"
#include "model/ops/linear.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

// Below this many elements a tile's row loop costs less than waking OpenMP's team.
constexpr int64_t kThreadedElements = 16384;

}  // namespace

LinearResidualLayerNormOp::LinearResidualLayerNormOp(int64_t rows, int64_t in_features,
                                                     int64_t channels, bool has_bias,
                                                     int64_t weight_row_offset, float dropout_p,
                                                     uint64_t dropout_salt, int tile_rows)
    : rows_(rows),
      in_features_(in_features),
      channels_(channels),
      has_bias_(has_bias),
      weight_row_offset_(weight_row_offset),
      dropout_p_(dropout_p),
      dropout_salt_(dropout_salt),
      tile_rows_(tile_rows) {
  FT_CHECK(rows > 0 && in_features > 0 && channels > 0 && tile_rows > 0,
           "LinearResidualLayerNormOp: non-positive shape rows=", rows, " in=", in_features,
           " channels=", channels, " tile_rows=", tile_rows);
  FT_CHECK(weight_row_offset >= 0, "LinearResidualLayerNormOp: negative weight row offset ",
           weight_row_offset);
  FT_CHECK(std::isfinite(dropout_p) && dropout_p >= 0.0f && dropout_p < 1.0f,
           "LinearResidualLayerNormOp: dropout probability ", dropout_p, " is outside [0, 1)");
}

void LinearResidualLayerNormOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 2, 2, has_bias_ ? 4 : 3);
  const int64_t numel = rows_ * channels_;
  expect_numel(ws.values[inputs[0]], numel, *this, "input residual_in");
  expect_numel(ws.values[inputs[1]], rows_ * in_features_, *this, "input x");
  expect_numel(ws.values[outputs[0]], numel, *this, "output residual_out");
  expect_numel(ws.values[outputs[1]], numel, *this, "output normed");
  const int64_t weight_rows = weight_row_offset_ + channels_;
  FT_CHECK(params[this->params[0]].value.numel() >= weight_rows * in_features_, kind(), " '", name,
           "': weight holds fewer than ", weight_rows, " rows of ", in_features_);
  if (has_bias_)
    FT_CHECK(params[this->params[1]].value.numel() >= weight_rows, kind(), " '", name,
             "': bias holds fewer than ", weight_rows, " values");
  expect_numel(params[this->params[ln_weight_index()]].value, channels_, *this, "LayerNorm weight");
  expect_numel(params[this->params[ln_weight_index() + 1]].value, channels_, *this,
               "LayerNorm bias");
}

void LinearResidualLayerNormOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const int64_t C = channels_;
  reuse_or_allocate(mean_, rows_, ws.device);
  reuse_or_allocate(rstd_, rows_, ws.device);
  if (dropout_p_ > 0.0f)
    reuse_or_allocate(keep_mask_, (rows_ * C + 3) / 4, ws.device);  // bytes in float storage
  else
    keep_mask_ = Tensor();
  FT_RUN_ON_CUDA(ws, forward_cuda(ws, params));
  const GemmOperand x = value_operand(ws.values[inputs[1]]);
  const GemmOperand weight =
      weight_operand(params[this->params[0]], weight_row_offset_ * in_features_, x.dtype);
  const float* bias =
      has_bias_ ? params[this->params[1]].value.data() + weight_row_offset_ : nullptr;
  Tensor& normed = ws.values[outputs[1]];
  ResidualLayerNormRows rows;
  rows.out = ws.values[outputs[0]].data();
  rows.out_stride = ws.row_stride(outputs[0]);
  if (normed.dtype() == DType::kBF16)
    rows.normed_bf16 = normed.bf16_data();
  else
    rows.normed = normed.data();
  rows.normed_stride = ws.row_stride(outputs[1]);
  rows.residual_in = ws.values[inputs[0]].data();
  rows.in_stride = ws.row_stride(inputs[0]);
  rows.branch = nullptr;
  rows.branch_stride = C;
  rows.weight = params[this->params[ln_weight_index()]].value.data();
  rows.bias = params[this->params[ln_weight_index() + 1]].value.data();
  rows.keep_mask = dropout_p_ > 0.0f ? keep_mask_bytes() : nullptr;
  rows.mean = mean_.data();
  rows.rstd = rstd_.data();
  rows.channels = C;
  rows.dropout_p = dropout_p_;
  rows.seed = ws.dropout_seed ^ dropout_salt_;
  reuse_or_allocate(branch_, tile_rows_ * C, ws.device);
  rows.branch = branch_.data();
  const int64_t x_stride = ws.row_stride(inputs[1]);
  for (int64_t first = 0; first < rows_; first += tile_rows_) {
    const int64_t tile = std::min<int64_t>(tile_rows_, rows_ - first);
    gemm(branch_.data(), x.at(first * x_stride), weight,
         linear_forward_gemm(tile, in_features_, C, bias, C, x_stride));
    rows.branch_first_row = first;
    // Rows are independent in forward: threads take contiguous parts of the tile.
#pragma omp parallel if (tile * C >= kThreadedElements)
    {
      const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
      const int64_t chunk = (tile + parts - 1) / parts;
      const int64_t begin = first + std::min(tile, part * chunk);
      const int64_t end = first + std::min(tile, (part + 1) * chunk);
      std::vector<float> row_buffer(static_cast<size_t>(C));
      residual_layernorm_forward_rows(rows, begin, end, row_buffer.data());
    }
  }
}

void LinearResidualLayerNormOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  FT_CHECK(mean_.numel() == rows_ && mean_.device() == ws.device, kind(), " '", name,
           "': backward before forward");
  FT_RUN_ON_CUDA(ws, backward_cuda(ws, params));
  const int64_t C = channels_;
  const GemmOperand x = value_operand(ws.values[inputs[1]]);
  const bool bf16_gemms = x.dtype == DType::kBF16;
  const GemmOperand weight =
      weight_operand(params[this->params[0]], weight_row_offset_ * in_features_, x.dtype);
  float* dweight = params[this->params[0]].grad.data() + weight_row_offset_ * in_features_;
  float* dbias = has_bias_ ? params[this->params[1]].grad.data() + weight_row_offset_ : nullptr;
  Tensor& dx_tensor = ws.grads[inputs[1]];
  float* dx = dx_tensor.defined() && dx_tensor.numel() > 0 ? dx_tensor.data() : nullptr;
  const bool overwrite_dx = ws.grad_is_fresh(inputs[1]);
  const int64_t x_stride = ws.row_stride(inputs[1]);
  ResidualLayerNormGradRows grads;
  grads.d_in = ws.grads[inputs[0]].data();
  grads.in_stride = ws.row_stride(inputs[0]);
  grads.branch_stride = C;
  grads.fresh_in = ws.grad_is_fresh(inputs[0]);
  grads.fresh_branch = true;  // dy is this op's own buffer
  grads.d_out = ws.grads[outputs[0]].data();
  grads.out = ws.values[outputs[0]].data();
  grads.out_stride = ws.row_stride(outputs[0]);
  grads.d_normed = ws.grads[outputs[1]].data();
  grads.normed_stride = ws.row_stride(outputs[1]);
  grads.weight = params[this->params[ln_weight_index()]].value.data();
  grads.keep_mask = dropout_p_ > 0.0f ? keep_mask_bytes() : nullptr;
  grads.mean = mean_.data();
  grads.rstd = rstd_.data();
  grads.channels = C;
  grads.dropout_p = dropout_p_;
  // dy: one tile, rounded into every row's bf16 copy that the GEMMs read; or, for fp32 GEMMs,
  // every row, as dW reads it.
  reuse_or_allocate(dbranch_, (bf16_gemms ? tile_rows_ : rows_) * C, ws.device);
  if (bf16_gemms) dbranch_bf16_.resize(static_cast<size_t>(rows_ * C));
  const int64_t num_tiles = (rows_ + tile_rows_ - 1) / tile_rows_;
  // Per tile: [LayerNorm dweight partial C | dbias partial C], as ResidualLayerNormOp sums them.
  std::vector<float> tile_partials(static_cast<size_t>(num_tiles) * 2 * C, 0.0f);
  for (int64_t tile_index = 0; tile_index < num_tiles; ++tile_index) {
    const int64_t first = tile_index * tile_rows_;
    const int64_t tile = std::min<int64_t>(tile_rows_, rows_ - first);
    float* dy = dbranch_.data() + (bf16_gemms ? 0 : first * C);
    grads.d_branch = dy;
    grads.branch_first_row = first;
    float* partial = tile_partials.data() + tile_index * 2 * C;
    residual_layernorm_backward_rows(grads, first, first + tile, partial, partial + C);
    // y = x W^T + b  =>  db = sum over rows of dy, row by row as LinearOp sums it; the bf16
    // GEMMs' copy of dy is rounded in the same pass, while the tile is hot.
    for (int64_t row = 0; row < tile; ++row) {
      const float* dy_row = dy + row * C;
      if (bf16_gemms) {
        bf16_bits* rounded_row = dbranch_bf16_.data() + (first + row) * C;
        if (dbias == nullptr) {
          store_row_bf16(rounded_row, dy_row, C);
          continue;
        }
#pragma omp simd
        for (int64_t o = 0; o < C; ++o) {
          rounded_row[o] = float_to_bf16(dy_row[o]);
          dbias[o] += dy_row[o];
        }
      } else if (dbias != nullptr) {
#pragma omp simd
        for (int64_t o = 0; o < C; ++o) dbias[o] += dy_row[o];
      }
    }
    if (dx == nullptr) continue;
    const GemmOperand dy_tile =
        bf16_gemms ? GemmOperand(dbranch_bf16_.data() + first * C) : GemmOperand(dy);
    gemm(dx + first * x_stride, dy_tile, weight,
         linear_dx_gemm(tile, in_features_, C, C, x_stride, overwrite_dx));
  }
  // dW = dy^T x over every row at once (K = rows keeps the GEMM efficient).
  const GemmOperand dy_rows =
      bf16_gemms ? GemmOperand(dbranch_bf16_.data()) : GemmOperand(dbranch_.data());
  gemm(dweight, dy_rows, x, linear_dweight_gemm(rows_, in_features_, C, C, x_stride));
  add_tile_partials(params[this->params[ln_weight_index()]].grad.data(),
                    params[this->params[ln_weight_index() + 1]].grad.data(), tile_partials, C);
}

#if defined(FT_HAVE_CUDA)
// The pair's kernels one after the other through an fp32 [rows, C] branch: linear.cu's GEMM,
// then residual_layernorm.cu's rows; backward the reverse, as ResidualLayerNormOp::backward_cuda
// and LinearOp run them.
void LinearResidualLayerNormOp::forward_cuda(Workspace& ws, ParamStore& params) {
  const int64_t C = channels_;
  reuse_or_allocate(branch_, rows_ * C, ws.device);
  const GemmOperand x = value_operand(ws.values[inputs[1]]);
  const GemmOperand weight =
      weight_operand(params[this->params[0]], weight_row_offset_ * in_features_, x.dtype);
  const float* bias =
      has_bias_ ? params[this->params[1]].value.data() + weight_row_offset_ : nullptr;
  linear_forward_cuda(branch_.data(), x, weight, bias, rows_, in_features_, C, C,
                      ws.row_stride(inputs[1]), ws.stream);
  Tensor& normed = ws.values[outputs[1]];
  uint8_t* keep_mask = dropout_p_ > 0.0f ? keep_mask_bytes() : nullptr;
  const float* ln_weight = params[this->params[ln_weight_index()]].value.data();
  const float* ln_bias = params[this->params[ln_weight_index() + 1]].value.data();
  float* out = ws.values[outputs[0]].data();
  const float* residual_in = ws.values[inputs[0]].data();
  const int64_t out_stride = ws.row_stride(outputs[0]), normed_stride = ws.row_stride(outputs[1]);
  const int64_t in_stride = ws.row_stride(inputs[0]);
  if (normed.dtype() == DType::kBF16)
    residual_layernorm_forward_cuda(out, normed.bf16_data(), keep_mask, mean_.data(), rstd_.data(),
                                    residual_in, branch_.data(), ln_weight, ln_bias, dropout_p_,
                                    ws.device_dropout_seed(), dropout_salt_, rows_, C, out_stride,
                                    normed_stride, in_stride, C, ws.stream);
  else
    residual_layernorm_forward_cuda(out, normed.data(), keep_mask, mean_.data(), rstd_.data(),
                                    residual_in, branch_.data(), ln_weight, ln_bias, dropout_p_,
                                    ws.device_dropout_seed(), dropout_salt_, rows_, C, out_stride,
                                    normed_stride, in_stride, C, ws.stream);
}

void LinearResidualLayerNormOp::backward_cuda(Workspace& ws, ParamStore& params) {
  const int64_t C = channels_;
  reuse_or_allocate(dbranch_, rows_ * C, ws.device);
  const int64_t out_stride = ws.row_stride(outputs[0]), normed_stride = ws.row_stride(outputs[1]);
  residual_layernorm_backward_input_cuda(
      ws.grads[inputs[0]].data(), dbranch_.data(), ws.grads[outputs[0]].data(),
      ws.grads[outputs[1]].data(), ws.values[outputs[0]].data(),
      params[this->params[ln_weight_index()]].value.data(),
      dropout_p_ > 0.0f ? keep_mask_bytes() : nullptr, mean_.data(), rstd_.data(), dropout_p_,
      ws.grad_is_fresh(inputs[0]), /*fresh_branch=*/true, rows_, C, out_stride, normed_stride,
      ws.row_stride(inputs[0]), C, ws.stream);
  LayerNormCudaTensors norm;
  norm.dweight = params[this->params[ln_weight_index()]].grad.data();
  norm.dbias = params[this->params[ln_weight_index() + 1]].grad.data();
  norm.dy = ws.grads[outputs[1]].data();
  norm.x = ws.values[outputs[0]].data();
  norm.y_stride = normed_stride;
  norm.x_stride = out_stride;
  reuse_or_allocate(param_grad_scratch_, layernorm_params_scratch_floats(1, rows_, C), ws.device);
  layernorm_batch_backward_params_cuda(param_grad_scratch_.data(), &norm, mean_.data(),
                                       rstd_.data(), 1, rows_, C, ws.stream);
  const Tensor& x = ws.values[inputs[1]];
  Tensor& dx_tensor = ws.grads[inputs[1]];
  float* dx = dx_tensor.defined() && dx_tensor.numel() > 0 ? dx_tensor.data() : nullptr;
  const bool overwrite_dx = ws.grad_is_fresh(inputs[1]);
  float* dweight = params[this->params[0]].grad.data() + weight_row_offset_ * in_features_;
  float* dbias = has_bias_ ? params[this->params[1]].grad.data() + weight_row_offset_ : nullptr;
  const int64_t x_stride = ws.row_stride(inputs[1]);
  if (x.dtype() == DType::kBF16) {
    const auto* weight = static_cast<const bf16_bits*>(
        weight_operand(params[this->params[0]], weight_row_offset_ * in_features_, DType::kBF16)
            .data);
    linear_backward_bf16_cuda(dx, overwrite_dx, dweight, dbias, dbranch_.data(), x.bf16_data(),
                              weight, rows_, in_features_, C, C, x_stride, ws.stream);
    return;
  }
  linear_backward_cuda(dx, overwrite_dx, dweight, dbias, dbranch_.data(), x.data(),
                       params[this->params[0]].value.data() + weight_row_offset_ * in_features_,
                       rows_, in_features_, C, C, x_stride, ws.stream);
}
#endif  // defined(FT_HAVE_CUDA)

// The Linear's GEMMs plus ResidualLayerNormOp's row work; the branch never reaches memory.
OpCost LinearResidualLayerNormOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(rows_) * in_features_ * channels_;
  const double elements = static_cast<double>(rows_ * channels_);
  const bool masked = dropout_p_ > 0.0f;
  cost.forward_flops = 2 * macs + (masked ? 11 : 9) * elements;
  cost.backward_flops = 4 * macs + (masked ? 17 : 16) * elements;
  cost.bytes_read += 4.0 * channels_ * (in_features_ + (has_bias_ ? 1 : 0)) + 8.0 * channels_;
  cost.saved_bytes = 8.0 * rows_ + (masked ? elements : 0.0);
  if (masked) cost.bytes_written += elements;  // the byte mask
  return cost;
}

}  // namespace ft
