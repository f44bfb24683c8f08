// BatchNormReluOp and BatchNormInferenceReluOp: BatchNorm's ReLU variants
// (batchnorm_relu_kernels.h), the ReLU applied inside BatchNorm's elementwise passes, on the
// tensors their model/ops bases resolve.
// Traffic per element against the unfused pair (fresh gradients, 4 bytes each): forward reads x
// twice and writes y (3) instead of 3 + relu's 2; backward reads x and dy twice and writes dx
// (5) instead of relu's 3 (y, dy, dz) + BatchNorm's 5 (x, dz twice, dx). On the CPU the mask
// z > 0 is recomputed from x (BatchNormMask::kRecomputed), which both passes read anyway; on
// CUDA it is read from y (7).
#include "fusion/ops/batchnorm_relu.h"

#include "core/check.h"
#include "fusion/ops/batchnorm_relu_kernels.h"

namespace ft {

BatchNormReluOp::BatchNormReluOp(int batch, int channels, int height, int width, float momentum,
                                 float eps)
    : BatchNormTrainOp("batchnorm_relu", batch, channels, height, width, momentum, eps) {}

void BatchNormReluOp::forward_impl(Workspace& ws, const BatchNormBranch& b,
                                   BatchNormScratch& scratch) {
  Tensor& y = ws.values[outputs[0]];
  if (y.dtype() == DType::kBF16) {
    FT_RUN_ON_CUDA(
        ws, batchnorm_relu_forward_train_cuda(y.bf16_data(), b, rows(), channels(), ws.stream));
    batchnorm_relu_forward_train(y.bf16_data(), b, rows(), channels(), scratch);
    return;
  }
  FT_RUN_ON_CUDA(ws, batchnorm_relu_forward_train_cuda(y.data(), b, rows(), channels(), ws.stream));
  batchnorm_relu_forward_train(y.data(), b, rows(), channels(), scratch);
}

// dz = dy * [z > 0] is formed on the fly inside both of the backward's passes: the CPU recomputes
// z from x (BatchNormMask::kRecomputed), so a bf16 y is never read back there; cuda reads the
// mask from y, fp32 or bf16 (rounding keeps every sign).
void BatchNormReluOp::backward_impl(Workspace& ws, const BatchNormBranch& b,
                                    BatchNormScratch& scratch) {
  const float* dy = ws.grads[outputs[0]].data();
  const Tensor& y = ws.values[outputs[0]];
  if (y.dtype() == DType::kBF16)
    FT_RUN_ON_CUDA(
        ws, batchnorm_relu_backward_cuda(dy, y.bf16_data(), b, rows(), channels(), ws.stream));
  FT_RUN_ON_CUDA(ws, batchnorm_relu_backward_cuda(dy, y.data(), b, rows(), channels(), ws.stream));
  batchnorm_relu_backward(dy, BatchNormMask::kRecomputed, nullptr, b, rows(), channels(), scratch);
}

OpCost BatchNormReluOp::cost(const Graph& graph) const {
  OpCost cost = batchnorm_cost(*this, graph, channels(), /*batch_statistics=*/true);
  const double numel = static_cast<double>(rows()) * channels();
  cost.forward_flops += numel;   // the max
  cost.backward_flops += numel;  // the mask, in each of two passes over y
  return cost;
}

BatchNormInferenceReluOp::BatchNormInferenceReluOp(int batch, int channels, int height, int width,
                                                   float eps)
    : BatchNormInferenceBase("batchnorm_inference_relu", batch, channels, height, width, eps) {}

void BatchNormInferenceReluOp::forward_impl(Workspace& ws, const BatchNormBranch& b,
                                            BatchNormScratch& scratch) {
  float* y = ws.values[outputs[0]].data();
  FT_RUN_ON_CUDA(ws, batchnorm_relu_forward_inference_cuda(y, b, rows(), channels(), ws.stream));
  batchnorm_relu_forward_inference(y, b, rows(), channels(), scratch);
}

OpCost BatchNormInferenceReluOp::cost(const Graph& graph) const {
  OpCost cost = batchnorm_cost(*this, graph, channels(), /*batch_statistics=*/false);
  cost.forward_flops += static_cast<double>(rows()) * channels();
  return cost;
}

}  // namespace ft
