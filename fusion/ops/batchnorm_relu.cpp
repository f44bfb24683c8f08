// BatchNormReluOp and BatchNormInferenceReluOp: the batchnorm_* functions of
// model/ops/batchnorm.h with the ReLU applied inside their elementwise passes.
// Traffic per element against the unfused pair (fresh gradients, 4 bytes each): forward reads x
// twice and writes y (3) instead of 3 + relu's 2; backward reads x and dy twice and writes dx
// (5) instead of relu's 3 (y, dy, dz) + BatchNorm's 5 (x, dz twice, dx). On the CPU the mask
// z > 0 is recomputed from x (BatchNormMask::kRecomputed), which both passes read anyway; on
// CUDA it is read from y (7).
#include "fusion/ops/batchnorm_relu.h"

#include "core/check.h"

namespace ft {

BatchNormReluOp::BatchNormReluOp(int batch, int channels, int height, int width, float momentum,
                                 float eps)
    : batch_(batch),
      channels_(channels),
      height_(height),
      width_(width),
      rows_(static_cast<int64_t>(batch) * height * width),
      momentum_(momentum),
      eps_(eps) {
  check_batchnorm_sizes("batchnorm_relu", batch, channels, height, width, 2, momentum, eps);
  saved_mean_.assign(channels, 0.0f);
  saved_invstd_.assign(channels, 0.0f);
}

void BatchNormReluOp::forward(Workspace& ws, ParamStore& params) {
  batchnorm_op_forward_train(*this, ws, params, saved_mean_.data(), saved_invstd_.data(), rows_,
                             channels_, momentum_, eps_, BatchNormActivation::kRelu, scratch_);
  forward_ran_ = true;
}

// dz = dy * [z > 0] is formed on the fly inside both of batchnorm_backward's passes.
void BatchNormReluOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(forward_ran_, "batchnorm_relu '", name, "': backward before forward");
  batchnorm_op_backward(*this, ws, params, saved_mean_.data(), saved_invstd_.data(), rows_,
                        channels_, BatchNormActivation::kRelu, scratch_);
}

OpCost BatchNormReluOp::cost(const Graph& graph) const {
  OpCost cost = batchnorm_cost(*this, graph, channels_, /*batch_statistics=*/true);
  const double numel = static_cast<double>(rows_) * channels_;
  cost.forward_flops += numel;   // the max
  cost.backward_flops += numel;  // the mask, in each of two passes over y
  return cost;
}

BatchNormInferenceReluOp::BatchNormInferenceReluOp(int batch, int channels, int height, int width,
                                                   float eps)
    : batch_(batch),
      channels_(channels),
      height_(height),
      width_(width),
      rows_(static_cast<int64_t>(batch) * height * width),
      eps_(eps) {
  check_batchnorm_sizes("batchnorm_inference_relu", batch, channels, height, width, 1, 0.0f, eps);
}

void BatchNormInferenceReluOp::forward(Workspace& ws, ParamStore& params) {
  batchnorm_op_forward_inference(*this, ws, params, rows_, channels_, eps_,
                                 BatchNormActivation::kRelu, scratch_);
}

void BatchNormInferenceReluOp::backward(Workspace&, ParamStore&) {
  FT_FAIL("batchnorm_inference_relu '", name, "': eval graph has no backward");
}

OpCost BatchNormInferenceReluOp::cost(const Graph& graph) const {
  OpCost cost = batchnorm_cost(*this, graph, channels_, /*batch_statistics=*/false);
  cost.forward_flops += static_cast<double>(rows_) * channels_;
  return cost;
}

}  // namespace ft
