// BatchNormInferenceOp: one elementwise pass, y = scale_c * x + shift_c with scale_c =
// gamma_c / sqrt(running_var_c + eps) and shift_c = beta_c - running_mean_c * scale_c
// (batchnorm_forward_inference in kernels/batchnorm.h).
#include "model/ops/batchnorm_inference.h"

#include "core/check.h"

namespace ft {

BatchNormInferenceBase::BatchNormInferenceBase(const char* kind, int batch, int channels,
                                               int height, int width, float eps)
    : batch_(batch),
      channels_(channels),
      height_(height),
      width_(width),
      rows_(static_cast<int64_t>(batch) * height * width),
      eps_(eps) {
  check_batchnorm_sizes(kind, batch, channels, height, width, 1, 0.0f, eps);
}

void BatchNormInferenceBase::forward(Workspace& ws, ParamStore& params) {
  check_batchnorm_wiring(*this, ws, params, rows_ * channels_, channels_);
  BatchNormBranch b;
  b.x = ws.values[inputs[0]].data();
  b.gamma = params[this->params[0]].value.data();
  b.beta = params[this->params[1]].value.data();
  b.running_mean = params[this->params[2]].value.data();
  b.running_var = params[this->params[3]].value.data();
  b.eps = eps_;
  forward_impl(ws, b, scratch_);
}

void BatchNormInferenceBase::backward(Workspace&, ParamStore&) {
  FT_FAIL(kind(), " '", name, "': eval graph has no backward");
}

BatchNormInferenceOp::BatchNormInferenceOp(int batch, int channels, int height, int width,
                                           float eps)
    : BatchNormInferenceBase("batchnorm2d_inference", batch, channels, height, width, eps) {}

void BatchNormInferenceOp::forward_impl(Workspace& ws, const BatchNormBranch& b,
                                        BatchNormScratch& scratch) {
  float* y = ws.values[outputs[0]].data();
  FT_RUN_ON_CUDA(ws, batchnorm_forward_inference_cuda(y, b, rows(), channels(), ws.stream));
  batchnorm_forward_inference(y, b, rows(), channels(), scratch);
}

OpCost BatchNormInferenceOp::cost(const Graph& graph) const {
  return batchnorm_cost(*this, graph, channels(), /*batch_statistics=*/false);
}

}  // namespace ft
