// [dropout ->] residual add -> LayerNorm in one sweep over row tiles (see residual_layernorm.h).
// Rows are independent in forward and in the input gradients, so work items (row blocks) run in
// parallel; the weight and bias gradients reduce over rows into one partial per item, added in
// item order.
#include "fusion/ops/residual_layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "kernels/dropout_math.h"
#include "kernels/layernorm.h"
#include "kernels/layernorm_math.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

// out = residual_in + (keep ? branch * scale : 0) over one row, recording keep. `first` is the
// row's flat element index, the counter DropoutOp hashes for the same element.
void masked_add_row(float* out, uint8_t* keep_mask, const float* residual_in, const float* branch,
                    float p, float scale, uint64_t seed, int64_t first, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = dropout_keep(seed, static_cast<uint64_t>(first + i), p);
    keep_mask[i] = keep ? 1 : 0;
    const float dropped = keep ? branch[i] * scale : 0.0f;
    out[i] = residual_in[i] + dropped;
  }
}

// Forward's inputs come from memory (the projection GEMM's output, the residual stream written
// ops ago), and its row loop stalled on them: asking for both kAheadRows rows ahead made it 0.26
// -> 0.20 ms per call at gpt_small (Zen 4). Backward's inputs are fresher, and the same prefetch
// made it slower there.
constexpr int64_t kAheadRows = 4;

void prefetch_row(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(row + i);
}

void add_row(float* out, const float* residual_in, const float* branch, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = residual_in[i] + branch[i];
}

// One row of backward, in one loop after the LayerNorm's two row means (layernorm_math.h):
//   total    = d_out + rstd * (dn * w - mean(g) - xhat * mean(g * xhat))   d of the sum
//   dweight += dn * xhat,  dbias += dn                                     (this item's partial)
//   d_in (+)= total,  d_branch (+)= keep ? total * scale : 0
// since out = a + b' passes its gradient unchanged to a and to b', and b' = b * keep * scale
// passes it masked and scaled to b; `=` for a fresh gradient (overwrites_fresh_input_grads).
struct RowBackward {
  float* d_in;
  float* d_branch;
  float* dweight;
  float* dbias;
  const float* d_out;
  const float* d_normed;
  const float* out;
  const float* weight;
  const uint8_t* keep_mask;  // null unless masked
  float mean, rstd, scale;
};

template <bool kFreshIn, bool kFreshBranch, bool kMasked>
void backward_row(const RowBackward& r, int64_t n) {
  float g_mean, g_xhat_mean;
  layernorm_row_backward_means(&g_mean, &g_xhat_mean, r.d_normed, r.out, r.weight, r.mean, r.rstd,
                               n);
  const float mean = r.mean, rstd = r.rstd, scale = r.scale;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float dn = r.d_normed[i];
    const float xhat = (r.out[i] - mean) * rstd;
    const float total = r.d_out[i] + rstd * (dn * r.weight[i] - g_mean - xhat * g_xhat_mean);
    r.dweight[i] += dn * xhat;
    r.dbias[i] += dn;
    const float to_branch = kMasked ? (r.keep_mask[i] ? total * scale : 0.0f) : total;
    r.d_in[i] = kFreshIn ? total : r.d_in[i] + total;
    r.d_branch[i] = kFreshBranch ? to_branch : r.d_branch[i] + to_branch;
  }
}

using RowBackwardFn = void (*)(const RowBackward&, int64_t);

RowBackwardFn row_backward_fn(bool fresh_in, bool fresh_branch, bool masked) {
  static const RowBackwardFn table[8] = {
      backward_row<false, false, false>, backward_row<false, false, true>,
      backward_row<false, true, false>,  backward_row<false, true, true>,
      backward_row<true, false, false>,  backward_row<true, false, true>,
      backward_row<true, true, false>,   backward_row<true, true, true>};
  return table[(fresh_in ? 4 : 0) + (fresh_branch ? 2 : 0) + (masked ? 1 : 0)];
}

}  // namespace

ResidualLayerNormOp::ResidualLayerNormOp(int64_t rows, int64_t channels, float dropout_p,
                                         uint64_t dropout_salt, int tile_rows)
    : rows_(rows),
      channels_(channels),
      dropout_p_(dropout_p),
      dropout_salt_(dropout_salt),
      tile_rows_(tile_rows) {
  FT_CHECK(rows > 0 && channels > 0 && tile_rows > 0,
           "ResidualLayerNormOp: non-positive shape rows=", rows, " channels=", channels,
           " tile_rows=", tile_rows);
  FT_CHECK(std::isfinite(dropout_p) && dropout_p >= 0.0f && dropout_p < 1.0f,
           "ResidualLayerNormOp: dropout probability ", dropout_p, " is outside [0, 1)");
}

void ResidualLayerNormOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 2, 2, 2);
  FT_CHECK(inputs[0] != inputs[1], kind(), " '", name, "': both inputs are value ", inputs[0]);
  FT_CHECK(outputs[0] != outputs[1], kind(), " '", name, "': both outputs are value ", outputs[0]);
  const int64_t numel = rows_ * channels_;
  expect_numel(ws.values[inputs[0]], numel, *this, "input residual_in");
  expect_numel(ws.values[inputs[1]], numel, *this, "input branch");
  expect_numel(ws.values[outputs[0]], numel, *this, "output residual_out");
  expect_numel(ws.values[outputs[1]], numel, *this, "output normed");
  expect_numel(params[this->params[0]].value, channels_, *this, "weight");
  expect_numel(params[this->params[1]].value, channels_, *this, "bias");
}

void ResidualLayerNormOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const int64_t C = channels_;
  const bool masked = dropout_p_ > 0.0f;
  reuse_or_allocate(mean_, rows_, ws.device);
  reuse_or_allocate(rstd_, rows_, ws.device);
  if (masked)
    reuse_or_allocate(keep_mask_, (rows_ * C + 3) / 4, ws.device);  // bytes in float storage
  else
    keep_mask_ = Tensor();
  uint8_t* keep_mask = masked ? keep_mask_bytes() : nullptr;
  float* mean = mean_.data();
  float* rstd = rstd_.data();
  const float* residual_in = ws.values[inputs[0]].data();
  const float* branch = ws.values[inputs[1]].data();
  float* out = ws.values[outputs[0]].data();
  // train.precision bf16 with fusion.vertical.cast: normed feeds GEMMs only, and is written in
  // bf16 from an L1 row buffer (the twin: this op in fp32, then a CastOp).
  Tensor& normed_value = ws.values[outputs[1]];
  const bool normed_in_bf16 = normed_value.dtype() == DType::kBF16;
  float* normed = normed_in_bf16 ? nullptr : normed_value.data();
  bf16_bits* normed_bf16 = normed_in_bf16 ? normed_value.bf16_data() : nullptr;
  const int64_t in_stride = ws.row_stride(inputs[0]), branch_stride = ws.row_stride(inputs[1]);
  const int64_t out_stride = ws.row_stride(outputs[0]), normed_stride = ws.row_stride(outputs[1]);
  const float* weight = params[this->params[0]].value.data();
  const float* bias = params[this->params[1]].value.data();
  const float p = dropout_p_, scale = dropout_scale(dropout_p_);
  const uint64_t seed = ws.dropout_seed ^ dropout_salt_;
  if (normed_in_bf16) {
    FT_RUN_ON_CUDA(ws, residual_layernorm_forward_cuda(
                           out, normed_bf16, keep_mask, mean, rstd, residual_in, branch, weight,
                           bias, p, ws.device_dropout_seed(), dropout_salt_, rows_, C, out_stride,
                           normed_stride, in_stride, branch_stride, ws.stream));
  } else {
    FT_RUN_ON_CUDA(ws, residual_layernorm_forward_cuda(
                           out, normed, keep_mask, mean, rstd, residual_in, branch, weight, bias, p,
                           ws.device_dropout_seed(), dropout_salt_, rows_, C, out_stride,
                           normed_stride, in_stride, branch_stride, ws.stream));
  }
  const int64_t item_rows = work_item_rows(), items = (rows_ + item_rows - 1) / item_rows;
#pragma omp parallel if (rows_ * C > 65536)
  {
    // One row buffer per thread, not per item (items are small: 32 of them at gpt_small).
    std::vector<float> row_buffer(normed_in_bf16 ? static_cast<size_t>(C) : 0);
#pragma omp for
    for (int64_t item = 0; item < items; ++item) {
      const int64_t end = std::min(rows_, (item + 1) * item_rows);
      for (int64_t row = item * item_rows; row < end; ++row) {
        if (row + kAheadRows < rows_) {
          prefetch_row(residual_in + (row + kAheadRows) * in_stride, C);
          prefetch_row(branch + (row + kAheadRows) * branch_stride, C);
        }
        float* out_row = out + row * out_stride;
        if (masked)
          masked_add_row(out_row, keep_mask + row * C, residual_in + row * in_stride,
                         branch + row * branch_stride, p, scale, seed, row * C, C);
        else
          add_row(out_row, residual_in + row * in_stride, branch + row * branch_stride, C);
        // The row just written is still in L1: normalising it now is the read the unfused
        // LayerNorm would make from memory.
        if (normed_in_bf16) {
          layernorm_row_forward(row_buffer.data(), mean + row, rstd + row, out_row, weight, bias, C,
                                kLayerNormEps);
          store_row_bf16(normed_bf16 + row * normed_stride, row_buffer.data(), C);
        } else {
          layernorm_row_forward(normed + row * normed_stride, mean + row, rstd + row, out_row,
                                weight, bias, C, kLayerNormEps);
        }
      }
    }
  }
}

void ResidualLayerNormOp::backward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  FT_CHECK(mean_.numel() == rows_ && mean_.device() == ws.device, kind(), " '", name,
           "': backward before forward");
  FT_RUN_ON_CUDA(ws, backward_cuda(ws, params));
  const int64_t C = channels_;
  const bool masked = dropout_p_ > 0.0f;
  const uint8_t* keep_mask = masked ? keep_mask_bytes() : nullptr;
  const float* mean = mean_.data();
  const float* rstd = rstd_.data();
  const float* out = ws.values[outputs[0]].data();
  const float* d_out = ws.grads[outputs[0]].data();
  const float* d_normed = ws.grads[outputs[1]].data();
  float* d_in = ws.grads[inputs[0]].data();
  float* d_branch = ws.grads[inputs[1]].data();
  const int64_t out_stride = ws.row_stride(outputs[0]), normed_stride = ws.row_stride(outputs[1]);
  const int64_t in_stride = ws.row_stride(inputs[0]), branch_stride = ws.row_stride(inputs[1]);
  const float* weight = params[this->params[0]].value.data();
  const float scale = dropout_scale(dropout_p_);
  const RowBackwardFn backward_rows =
      row_backward_fn(ws.grad_is_fresh(inputs[0]), ws.grad_is_fresh(inputs[1]), masked);
  const int64_t item_rows = work_item_rows(), items = (rows_ + item_rows - 1) / item_rows;
  // Per work item: [dweight partial C | dbias partial C].
  std::vector<float> item_partials(static_cast<size_t>(items) * 2 * C, 0.0f);
#pragma omp parallel for if (rows_ * C > 65536)
  for (int64_t item = 0; item < items; ++item) {
    RowBackward r;
    r.dweight = item_partials.data() + item * 2 * C;
    r.dbias = r.dweight + C;
    r.weight = weight;
    r.scale = scale;
    const int64_t end = std::min(rows_, (item + 1) * item_rows);
    for (int64_t row = item * item_rows; row < end; ++row) {
      r.d_in = d_in + row * in_stride;
      r.d_branch = d_branch + row * branch_stride;
      r.d_out = d_out + row * out_stride;
      r.d_normed = d_normed + row * normed_stride;
      r.out = out + row * out_stride;
      r.keep_mask = masked ? keep_mask + row * C : nullptr;
      r.mean = mean[row];
      r.rstd = rstd[row];
      backward_rows(r, C);
    }
  }
  float* weight_grad = params[this->params[0]].grad.data();
  float* bias_grad = params[this->params[1]].grad.data();
  for (int64_t item = 0; item < items; ++item) {
    const float* dweight = item_partials.data() + item * 2 * C;
    const float* dbias = dweight + C;
    for (int64_t c = 0; c < C; ++c) {
      weight_grad[c] += dweight[c];
      bias_grad[c] += dbias[c];
    }
  }
}

#if defined(FT_HAVE_CUDA)
// The input gradients row by row, then the weight and bias gradients as LayerNorm's over
// (d normed, out): the same sums as the CPU tiles', in a fixed order of their own.
void ResidualLayerNormOp::backward_cuda(Workspace& ws, ParamStore& params) {
  const int64_t out_stride = ws.row_stride(outputs[0]), normed_stride = ws.row_stride(outputs[1]);
  const int64_t in_stride = ws.row_stride(inputs[0]), branch_stride = ws.row_stride(inputs[1]);
  const bool masked = dropout_p_ > 0.0f;
  residual_layernorm_backward_input_cuda(
      ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(), ws.grads[outputs[0]].data(),
      ws.grads[outputs[1]].data(), ws.values[outputs[0]].data(),
      params[this->params[0]].value.data(), masked ? keep_mask_bytes() : nullptr, mean_.data(),
      rstd_.data(), dropout_p_, ws.grad_is_fresh(inputs[0]), ws.grad_is_fresh(inputs[1]), rows_,
      channels_, out_stride, normed_stride, in_stride, branch_stride, ws.stream);
  LayerNormCudaTensors norm;
  norm.dweight = params[this->params[0]].grad.data();
  norm.dbias = params[this->params[1]].grad.data();
  norm.dy = ws.grads[outputs[1]].data();
  norm.x = ws.values[outputs[0]].data();
  norm.y_stride = normed_stride;
  norm.x_stride = out_stride;
  reuse_or_allocate(param_grad_scratch_, layernorm_params_scratch_floats(1, rows_, channels_),
                    ws.device);
  layernorm_batch_backward_params_cuda(param_grad_scratch_.data(), &norm, mean_.data(),
                                       rstd_.data(), 1, rows_, channels_, ws.stream);
}
#endif  // defined(FT_HAVE_CUDA)

std::vector<uint8_t> ResidualLayerNormOp::keep_mask() const {
  if (dropout_p_ == 0.0f || keep_mask_.numel() == 0) return {};
  const std::vector<float> words = keep_mask_.to_host_vector();
  std::vector<uint8_t> bytes(static_cast<size_t>(rows_ * channels_));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

OpCost ResidualLayerNormOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double elements = static_cast<double>(rows_ * channels_);
  const bool masked = dropout_p_ > 0.0f;
  // add + LayerNorm (8), plus compare and scale with dropout.
  cost.forward_flops = (masked ? 11 : 9) * elements;
  // LayerNorm (14), the two summands' gradients (2), the masked scale with dropout.
  cost.backward_flops = (masked ? 17 : 16) * elements;
  cost.bytes_read += 8.0 * channels_;  // weight, bias
  cost.saved_bytes = 8.0 * rows_ + (masked ? elements : 0.0);
  if (masked) cost.bytes_written += elements;  // the byte mask
  return cost;
}

}  // namespace ft
