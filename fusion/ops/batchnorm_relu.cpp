// BatchNormReluOp and BatchNormInferenceReluOp: the batchnorm_* functions of
// model/ops/batchnorm.h with the ReLU applied inside their elementwise passes.
// Traffic per element against the unfused pair (fresh gradients, 4 bytes each): forward reads x
// twice and writes y (3) instead of 3 + relu's 2; backward reads x and dy twice and writes dx
// (5) instead of relu's 3 (y, dy, dz) + BatchNorm's 5 (x, dz twice, dx). On the CPU the mask
// z > 0 is recomputed from x (BatchNormMask::kRecomputed), which both passes read anyway; on
// CUDA it is read from y (7).
#include "fusion/ops/batchnorm_relu.h"

namespace ft {

BatchNormReluOp::BatchNormReluOp(int batch, int channels, int height, int width, float momentum,
                                 float eps)
    : BatchNormTrainOp("batchnorm_relu", BatchNormActivation::kRelu, batch, channels, height, width,
                       momentum, eps) {}

OpCost BatchNormReluOp::cost(const Graph& graph) const {
  OpCost cost = batchnorm_cost(*this, graph, channels(), /*batch_statistics=*/true);
  const double numel = static_cast<double>(rows()) * channels();
  cost.forward_flops += numel;   // the max
  cost.backward_flops += numel;  // the mask, in each of two passes over y
  return cost;
}

BatchNormInferenceReluOp::BatchNormInferenceReluOp(int batch, int channels, int height, int width,
                                                   float eps)
    : BatchNormInferenceBase("batchnorm_inference_relu", BatchNormActivation::kRelu, batch,
                             channels, height, width, eps) {}

OpCost BatchNormInferenceReluOp::cost(const Graph& graph) const {
  OpCost cost = batchnorm_cost(*this, graph, channels(), /*batch_statistics=*/false);
  cost.forward_flops += static_cast<double>(rows()) * channels();
  return cost;
}

}  // namespace ft
