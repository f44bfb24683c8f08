// Linear + GELU over row tiles: each tile's pre-activation is produced by the GEMM into one
// cache-sized scratch tile and consumed there by the GELU, which also keeps gelu'(pre) for
// backward, instead of the eager pair's full [rows, out] round trip through memory between two
// ops. Backward's gelu' sweep is then a product (dy gelu'), and dpre feeds the dx GEMM while the
// tile is in cache.
#include "fusion/ops/linear_gelu.h"

#include <omp.h>

#include <algorithm>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/gemm.h"
#include "core/math/gelu_math.h"
#include "fusion/ops/gelu_rows_avx512.h"
#include "model/ops/linear.h"

namespace ft {
namespace {

// Below this many elements a tile's elementwise loop costs less than waking OpenMP's team.
constexpr int64_t kThreadedElements = 16384;

// Columns [begin, end) of one row: dpre = dy gelu'(pre), gelu'(pre) as forward kept it in
// `grad_row`; db += dpre (skipped when null) and dpre rounded to bf16, with no fp32 dpre stored.
void gelu_backward_row_bf16(bf16_bits* dpre_row, float* dbias, const float* dy_row,
                            const float* grad_row, int64_t begin, int64_t end) {
  if (gelu_rows_avx512_enabled())
    return gelu_backward_row_bf16_avx512(dpre_row, dbias, dy_row, grad_row, begin, end);
  if (dbias == nullptr) {
#pragma omp simd
    for (int64_t o = begin; o < end; ++o) dpre_row[o] = float_to_bf16(dy_row[o] * grad_row[o]);
    return;
  }
#pragma omp simd
  for (int64_t o = begin; o < end; ++o) {
    const float gradient = dy_row[o] * grad_row[o];
    dbias[o] += gradient;
    dpre_row[o] = float_to_bf16(gradient);
  }
}

// pre = x W^T  =>  dx = dpre W  ([tile, out] · [out, in]) for rows [first, first + tile), while
// the dpre tile is hot. dx null skips it.
void multiply_dpre_tile(float* dx, bool overwrite_dx, GemmOperand dpre_tile, GemmOperand weight,
                        int64_t first, int64_t tile, int64_t in_features, int64_t out_features,
                        int64_t x_stride) {
  if (dx == nullptr) return;
  GemmArgs args;
  args.m = tile;
  args.n = in_features;
  args.k = out_features;
  args.ldc = x_stride;
  args.accumulate = !overwrite_dx;
  gemm(dx + first * x_stride, dpre_tile, weight, args);
}

}  // namespace

namespace {

// y = gelu(pre) and gelu'(pre) for one row, the sigmoid term computed once for both: the same
// operations as gelu_tanh and gelu_tanh_grad (core/math/gelu_math.h), so the same bits.
void store(float& y, float value) {
  y = value;
}
void store(bf16_bits& y, float value) {
  y = float_to_bf16(value);
}
template <typename Out>
void gelu_row(Out* y_row, float* grad_row, const float* pre_row, int64_t count) {
  for (int64_t o = 0; o < count; ++o) {
    const float x = pre_row[o], g = gelu_sigmoid_term(x);
    store(y_row[o], x * g);
    grad_row[o] = gelu_tanh_grad_from_sigmoid(x, g);
  }
}
void gelu_row(bf16_bits* y_row, float* grad_row, const float* pre_row, int64_t count) {
  if (gelu_rows_avx512_enabled())
    return gelu_and_grad_row_bf16_avx512(y_row, grad_row, pre_row, count);
  gelu_row<bf16_bits>(y_row, grad_row, pre_row, count);
}

}  // namespace

template <typename Out>
void linear_gelu_forward(Out* y, float* gelu_grad, float* pre_tile, GemmOperand x,
                         GemmOperand weight, const float* bias, int64_t rows, int64_t in_features,
                         int64_t out_features, int tile_rows, int64_t y_stride, int64_t x_stride) {
  if (y_stride == 0) y_stride = out_features;
  if (x_stride == 0) x_stride = in_features;
  for (int64_t first = 0; first < rows; first += tile_rows) {
    const int64_t tile = std::min<int64_t>(tile_rows, rows - first);
    GemmArgs args;
    args.m = tile;
    args.n = out_features;
    args.k = in_features;
    args.lda = x_stride;
    args.transpose_b = true;  // W is stored [out, in] = [N, K]
    args.bias = bias;
    gemm(pre_tile, x.at(first * x_stride), weight, args);
    Out* y_tile = y + first * y_stride;
    float* grad_tile = gelu_grad + first * out_features;
#pragma omp parallel for if (tile * out_features >= kThreadedElements)
    for (int64_t row = 0; row < tile; ++row)
      gelu_row(y_tile + row * y_stride, grad_tile + row * out_features,
               pre_tile + row * out_features, out_features);
  }
}

template void linear_gelu_forward(float*, float*, float*, GemmOperand, GemmOperand, const float*,
                                  int64_t, int64_t, int64_t, int, int64_t, int64_t);
template void linear_gelu_forward(bf16_bits*, float*, float*, GemmOperand, GemmOperand,
                                  const float*, int64_t, int64_t, int64_t, int, int64_t, int64_t);

void linear_gelu_backward(float* dx, bool overwrite_dx, float* dweight, float* dbias, float* dpre,
                          bf16_bits* dpre_bf16, const float* dy, const float* gelu_grad,
                          GemmOperand x, GemmOperand weight, int64_t rows, int64_t in_features,
                          int64_t out_features, int tile_rows, int64_t dy_stride,
                          int64_t x_stride) {
  FT_CHECK((x.dtype == DType::kBF16) == (dpre_bf16 != nullptr),
           "linear_gelu_backward: bf16 GEMMs need the dpre_bf16 buffer, fp32 ones take none");
  if (dy_stride == 0) dy_stride = out_features;
  if (x_stride == 0) x_stride = in_features;
  for (int64_t first = 0; first < rows; first += tile_rows) {
    const int64_t tile = std::min<int64_t>(tile_rows, rows - first);
    const float* grad_tile = gelu_grad + first * out_features;
    const float* dy_tile = dy + first * dy_stride;
    if (dpre_bf16 != nullptr) {
      // bf16: one sweep computes dpre, adds it to db and rounds it for the GEMMs, so the fp32
      // dpre is never stored and read back twice (it was 3 sweeps over 4 MiB a layer of
      // gpt_small). Threads split columns, so db still sums each column in row order.
      bf16_bits* dpre_bf16_tile = dpre_bf16 + first * out_features;
      // Long rows keep the vector loop busy; 64-column blocks made this sweep 20% slower.
      const int team = tile * out_features >= kThreadedElements ? omp_get_max_threads() : 1;
      const int64_t chunk = (out_features + team - 1) / team;
#pragma omp parallel for num_threads(team) if (team > 1)
      for (int part = 0; part < team; ++part) {
        const int64_t begin = part * chunk, end = std::min(out_features, begin + chunk);
        for (int64_t row = 0; row < tile; ++row)
          gelu_backward_row_bf16(dpre_bf16_tile + row * out_features, dbias,
                                 dy_tile + row * dy_stride, grad_tile + row * out_features, begin,
                                 end);
      }
      multiply_dpre_tile(dx, overwrite_dx, dpre_bf16_tile, weight, first, tile, in_features,
                         out_features, x_stride);
      continue;
    }
    float* dpre_tile = dpre + first * out_features;
    // y = gelu(pre)  =>  dpre = dy gelu'(pre); gelu' is derived in core/math/gelu_math.h and
    // was kept by forward.
#pragma omp parallel for if (tile * out_features >= kThreadedElements)
    for (int64_t row = 0; row < tile; ++row) {
      const float* grad_row = grad_tile + row * out_features;
      const float* dy_row = dy_tile + row * dy_stride;
      float* dpre_row = dpre_tile + row * out_features;
      for (int64_t o = 0; o < out_features; ++o) dpre_row[o] = dy_row[o] * grad_row[o];
    }
    // pre = ... + b broadcast over rows  =>  db = sum over rows of dpre
    if (dbias != nullptr)
      for (int64_t row = 0; row < tile; ++row) {
        const float* dpre_row = dpre_tile + row * out_features;
        for (int64_t o = 0; o < out_features; ++o) dbias[o] += dpre_row[o];
      }
    multiply_dpre_tile(dx, overwrite_dx, dpre_tile, weight, first, tile, in_features, out_features,
                       x_stride);
  }
  // dW = dpre^T x over all rows at once: K = rows keeps this GEMM efficient, and splitting it by
  // tile would read and write all of dW once per tile.
  GemmArgs args;
  args.m = out_features;
  args.n = in_features;
  args.k = rows;
  args.transpose_a = true;  // dpre stored [rows, out] = [K, M]
  args.ldb = x_stride;
  args.accumulate = true;
  if (dpre_bf16 != nullptr)
    gemm(dweight, dpre_bf16, x, args);
  else
    gemm(dweight, dpre, x, args);
}

LinearGeluOp::LinearGeluOp(int64_t rows, int64_t in_features, int64_t out_features, bool has_bias,
                           int64_t weight_row_offset, int tile_rows, LinearGeluForward forward_kind)
    : rows_(rows),
      in_features_(in_features),
      out_features_(out_features),
      has_bias_(has_bias),
      weight_row_offset_(weight_row_offset),
      tile_rows_(static_cast<int>(std::min<int64_t>(tile_rows, rows))),
      forward_kind_(forward_kind) {
  FT_CHECK(rows > 0 && in_features > 0 && out_features > 0,
           "LinearGeluOp: non-positive shape rows=", rows, " in=", in_features,
           " out=", out_features);
  FT_CHECK(weight_row_offset >= 0, "LinearGeluOp: negative weight row offset ", weight_row_offset);
  FT_CHECK(tile_rows > 0, "LinearGeluOp: tile_rows ", tile_rows, " must be >= 1");
}

void LinearGeluOp::forward(Workspace& ws, ParamStore& params) {
  check_linear_wiring(*this, ws, params, rows_, in_features_, out_features_, has_bias_,
                      weight_row_offset_);
  const int64_t offset = weight_row_offset_ * in_features_;
  const float* bias =
      has_bias_ ? params[this->params[1]].value.data() + weight_row_offset_ : nullptr;
  Tensor& y_value = ws.values[outputs[0]];
  const Tensor& x_value = ws.values[inputs[0]];
  FT_CHECK(y_value.dtype() == DType::kF32 || forward_kind_ != LinearGeluForward::kGeluPostOp,
           kind(), " '", name, "': the GELU post-op form writes fp32 only");
  float* y = y_value.dtype() == DType::kF32 ? y_value.data() : nullptr;
  const GemmOperand x = value_operand(x_value);
  const GemmOperand weight = weight_operand(params[this->params[0]], offset, x.dtype);
  if (forward_kind_ == LinearGeluForward::kGeluPostOp) {
    GemmArgs args;
    args.m = rows_;
    args.n = out_features_;
    args.k = in_features_;
    args.lda = ws.row_stride(inputs[0]);
    args.ldc = ws.row_stride(outputs[0]);
    args.transpose_b = true;
    args.bias = bias;
    args.epilogue = Epilogue::kGeluTanh;
    FT_RUN_ON_CUDA(ws, gemm_cuda(y, x, weight, args, ws.stream));
    gemm(y, x, weight, args);
    return;
  }
  if (saved_.numel() != rows_ * out_features_ || saved_.device() != ws.device)
    saved_ = Tensor::empty({rows_, out_features_}, ws.device);
  if (ws.device == Device::kCpu && preactivation_tile_.numel() != tile_rows_ * out_features_)
    preactivation_tile_ = Tensor::empty({tile_rows_, out_features_});
  const int64_t y_stride = ws.row_stride(outputs[0]), x_stride = ws.row_stride(inputs[0]);
  // fusion.vertical.cast: y feeds GEMMs only and is written in bf16 straight from the tile.
  if (y_value.dtype() == DType::kBF16) {
    bf16_bits* y_bf16 = y_value.bf16_data();
    FT_RUN_ON_CUDA(
        ws, linear_gelu_forward_cuda(y_bf16, saved_.data(), x, weight, bias, rows_, in_features_,
                                     out_features_, y_stride, x_stride, ws.stream));
    linear_gelu_forward(y_bf16, saved_.data(), preactivation_tile_.data(), x, weight, bias, rows_,
                        in_features_, out_features_, tile_rows_, y_stride, x_stride);
    return;
  }
  FT_RUN_ON_CUDA(ws,
                 linear_gelu_forward_cuda(y, saved_.data(), x, weight, bias, rows_, in_features_,
                                          out_features_, y_stride, x_stride, ws.stream));
  linear_gelu_forward(y, saved_.data(), preactivation_tile_.data(), x, weight, bias, rows_,
                      in_features_, out_features_, tile_rows_, y_stride, x_stride);
}

void LinearGeluOp::backward(Workspace& ws, ParamStore& params) {
  check_linear_wiring(*this, ws, params, rows_, in_features_, out_features_, has_bias_,
                      weight_row_offset_);
  FT_CHECK(forward_kind_ == LinearGeluForward::kTiledKeepPreactivation, kind(), " '", name,
           "': built for inference (GELU post-op), which saves nothing for backward");
  FT_CHECK(saved_.numel() == rows_ * out_features_, kind(), " '", name,
           "': backward before forward");
  const int64_t offset = weight_row_offset_ * in_features_;
  float* dbias = has_bias_ ? params[this->params[1]].grad.data() + weight_row_offset_ : nullptr;
  Tensor& dx = ws.grads[inputs[0]];
  float* dx_data = dx.defined() && dx.numel() > 0 ? dx.data() : nullptr;
  const GemmOperand x = value_operand(ws.values[inputs[0]]);
  const GemmOperand weight = weight_operand(params[this->params[0]], offset, x.dtype);
  bf16_bits* dpre_bf16 = nullptr;
  if (x.dtype == DType::kBF16) {
    if (dpreactivation_bf16_.numel() != rows_ * out_features_ ||
        dpreactivation_bf16_.device() != ws.device)
      dpreactivation_bf16_ = Tensor::empty({rows_, out_features_}, ws.device, DType::kBF16);
    dpre_bf16 = dpreactivation_bf16_.bf16_data();
  }
  // The CPU's bf16 sweep rounds dpre without storing it in fp32; cuda's kernel stores both.
  const bool stores_fp32_dpre = x.dtype == DType::kF32 || ws.device == Device::kCuda;
  if (stores_fp32_dpre &&
      (dpreactivation_.numel() != rows_ * out_features_ || dpreactivation_.device() != ws.device))
    dpreactivation_ = Tensor::empty({rows_, out_features_}, ws.device);
  float* dpre = stores_fp32_dpre ? dpreactivation_.data() : nullptr;
  float* dweight = params[this->params[0]].grad.data() + offset;
  FT_RUN_ON_CUDA(ws, linear_gelu_backward_cuda(dx_data, ws.grad_is_fresh(inputs[0]), dweight, dbias,
                                               dpre, dpre_bf16, ws.grads[outputs[0]].data(),
                                               saved_.data(), x, weight, rows_, in_features_,
                                               out_features_, ws.row_stride(outputs[0]),
                                               ws.row_stride(inputs[0]), ws.stream));
  linear_gelu_backward(dx_data, ws.grad_is_fresh(inputs[0]), dweight, dbias, dpre, dpre_bf16,
                       ws.grads[outputs[0]].data(), saved_.data(), x, weight, rows_, in_features_,
                       out_features_, tile_rows_, ws.row_stride(outputs[0]),
                       ws.row_stride(inputs[0]));
}

// The Linear's GEMMs plus GeluOp's elementwise work; what backward needs (gelu'(pre) on the CPU,
// pre on cuda) is written once (training), and pre is re-read from cache, so the saved tensor
// counts as saved bytes rather than a second read.
OpCost LinearGeluOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(rows_) * in_features_ * out_features_;
  const double elements = static_cast<double>(rows_) * out_features_;
  cost.forward_flops = 2 * macs + 20 * elements;
  cost.backward_flops = 4 * macs + 30 * elements;
  cost.bytes_read += 4.0 * out_features_ * (in_features_ + (has_bias_ ? 1 : 0));
  if (forward_kind_ == LinearGeluForward::kTiledKeepPreactivation) {
    cost.bytes_written += 4.0 * elements;
    cost.saved_bytes = 4.0 * elements;
  }
  return cost;
}

}  // namespace ft
