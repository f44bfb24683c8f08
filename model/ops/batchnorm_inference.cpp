// BatchNormInferenceOp: one elementwise pass, y = scale_c * x + shift_c with scale_c =
// gamma_c / sqrt(running_var_c + eps) and shift_c = beta_c - running_mean_c * scale_c
// (batchnorm_forward_inference in model/ops/batchnorm.cpp).
#include "model/ops/batchnorm_inference.h"

#include "core/check.h"

namespace ft {

BatchNormInferenceBase::BatchNormInferenceBase(const char* kind, BatchNormActivation activation,
                                               int batch, int channels, int height, int width,
                                               float eps)
    : activation_(activation),
      batch_(batch),
      channels_(channels),
      height_(height),
      width_(width),
      rows_(static_cast<int64_t>(batch) * height * width),
      eps_(eps) {
  check_batchnorm_sizes(kind, batch, channels, height, width, 1, 0.0f, eps);
}

void BatchNormInferenceBase::forward(Workspace& ws, ParamStore& params) {
  batchnorm_op_forward_inference(*this, ws, params, rows_, channels_, eps_, activation_, scratch_);
}

void BatchNormInferenceBase::backward(Workspace&, ParamStore&) {
  FT_FAIL(kind(), " '", name, "': eval graph has no backward");
}

BatchNormInferenceOp::BatchNormInferenceOp(int batch, int channels, int height, int width,
                                           float eps)
    : BatchNormInferenceBase("batchnorm2d_inference", BatchNormActivation::kNone, batch, channels,
                             height, width, eps) {}

OpCost BatchNormInferenceOp::cost(const Graph& graph) const {
  return batchnorm_cost(*this, graph, channels(), /*batch_statistics=*/false);
}

}  // namespace ft
