// GlobalAvgPoolOp forward and backward over contiguous [H*W] planes.
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
  const int64_t planes = static_cast<int64_t>(batch_) * channels_;
  const int64_t plane = static_cast<int64_t>(height_) * width_;
  expect_numel(x, planes * plane, *this, "x");
  expect_numel(y, planes, *this, "y");
  const float* in = x.data();
  float* out = y.data();
  const float inv_plane = 1.0f / static_cast<float>(plane);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes; ++p) {
    const float* row = in + p * plane;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < plane; ++i) sum += row[i];
    out[p] = sum * inv_plane;
  }
}

// Every input of a plane contributes 1/(H W) to its mean: dx[b,c,h,w] += dy[b,c] / (H W).
void GlobalAvgPoolOp::backward(Workspace& ws, ParamStore&) {
  const float* dy = ws.grads[outputs[0]].data();
  float* dx = ws.grads[inputs[0]].data();
  const int64_t planes = static_cast<int64_t>(batch_) * channels_;
  const int64_t plane = static_cast<int64_t>(height_) * width_;
  const float inv_plane = 1.0f / static_cast<float>(plane);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes; ++p) {
    const float share = dy[p] * inv_plane;
    float* row = dx + p * plane;
#pragma omp simd
    for (int64_t i = 0; i < plane; ++i) row[i] += share;
  }
}

}  // namespace ft
