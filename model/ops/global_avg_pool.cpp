// GlobalAvgPoolOp forward and backward on NHWC: each sample is H*W rows of C channels, summed
// (or spread) a row at a time, vectorised over channels.
#include "model/ops/global_avg_pool.h"

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {

GlobalAvgPoolOp::GlobalAvgPoolOp(int batch, int channels, int height, int width)
    : batch_(batch), channels_(channels), height_(height), width_(width) {
  FT_CHECK(batch > 0 && channels > 0 && height > 0 && width > 0,
           "global_avg_pool: bad sizes batch=", batch, " channels=", channels, " height=", height,
           " width=", width);
}

void GlobalAvgPoolOp::forward(Workspace& ws, ParamStore&) {
  expect_arity(*this, 1, 1, 0);
  const Tensor& x = ws.values[inputs[0]];
  Tensor& y = ws.values[outputs[0]];
  const int channels = channels_;
  const int64_t positions = static_cast<int64_t>(height_) * width_;
  expect_numel(x, batch_ * positions * channels, *this, "x");
  expect_numel(y, static_cast<int64_t>(batch_) * channels, *this, "y");
  FT_RUN_ON_CUDA(
      ws, global_avg_pool_forward_cuda(y.data(), x.data(), batch_, positions, channels, ws.stream));
  const float* in = x.data();
  float* out = y.data();
  const float inv_positions = 1.0f / static_cast<float>(positions);
#pragma omp parallel for schedule(static)
  for (int b = 0; b < batch_; ++b) {
    const float* sample = in + b * positions * channels;
    float* __restrict mean = out + static_cast<int64_t>(b) * channels;
    for (int c = 0; c < channels; ++c) mean[c] = 0.0f;
    for (int64_t p = 0; p < positions; ++p) {
      const float* __restrict row = sample + p * channels;
#pragma omp simd
      for (int c = 0; c < channels; ++c) mean[c] += row[c];
    }
    for (int c = 0; c < channels; ++c) mean[c] *= inv_positions;
  }
}

// Every input of a channel contributes 1/(H W) to its mean: dx[b,h,w,c] += dy[b,c] / (H W).
void GlobalAvgPoolOp::backward(Workspace& ws, ParamStore&) {
  const float* dy = ws.grads[outputs[0]].data();
  float* dx = ws.grads[inputs[0]].data();
  const int channels = channels_;
  const int64_t positions = static_cast<int64_t>(height_) * width_;
  FT_RUN_ON_CUDA(ws, global_avg_pool_backward_cuda(dx, dy, batch_, positions, channels, ws.stream));
  const float inv_positions = 1.0f / static_cast<float>(positions);
#pragma omp parallel for schedule(static)
  for (int b = 0; b < batch_; ++b) {
    const float* __restrict dy_row = dy + static_cast<int64_t>(b) * channels;
    float* sample = dx + b * positions * channels;
    for (int64_t p = 0; p < positions; ++p) {
      float* __restrict row = sample + p * channels;
#pragma omp simd
      for (int c = 0; c < channels; ++c) row[c] += dy_row[c] * inv_positions;
    }
  }
}

OpCost GlobalAvgPoolOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double elements = static_cast<double>(batch_) * height_ * width_ * channels_;
  cost.forward_flops = elements + static_cast<double>(batch_) * channels_;
  cost.backward_flops = elements;
  return cost;
}

}  // namespace ft
