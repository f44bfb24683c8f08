// The BatchNorm op family's shared wiring (checks, the ops' calls into the batchnorm_* functions
// on either device, costs) and BatchNorm2dOp itself. The math is in batchnorm.cpp (CPU) and
// batchnorm.cu (CUDA).
#include "core/check.h"
#include "model/ops/batchnorm.h"
#include "model/ops/op_checks.h"

namespace ft {

void ensure_batchnorm_device_scratch(BatchNormScratch& scratch, int64_t rows, int channels) {
  const int64_t chunks = (rows + kBatchNormCudaRowsPerChunk - 1) / kBatchNormCudaRowsPerChunk;
  auto ensure = [](Tensor& tensor, int64_t numel) {
    if (!tensor.defined() || tensor.numel() != numel || tensor.device() != Device::kCuda)
      tensor = Tensor::empty({numel}, Device::kCuda);
  };
  ensure(scratch.device_saved, 2 * static_cast<int64_t>(channels));
  ensure(scratch.device_partials, 2 * chunks * channels);
  ensure(scratch.device_coefficients, 3 * static_cast<int64_t>(channels));
}

void check_batchnorm_sizes(const char* kind, int batch, int channels, int height, int width,
                           int64_t min_rows, float momentum, float eps) {
  FT_CHECK(batch > 0 && channels > 0 && height > 0 && width > 0, kind, ": bad sizes batch=", batch,
           " channels=", channels, " height=", height, " width=", width);
  const int64_t rows = static_cast<int64_t>(batch) * height * width;
  FT_CHECK(rows >= min_rows, kind, ": needs at least ", min_rows,
           " values per channel, got batch=", batch, " height=", height, " width=", width);
  FT_CHECK(momentum >= 0.0f && momentum <= 1.0f && eps > 0.0f, kind, ": momentum ", momentum,
           " must be in [0, 1] and eps ", eps, " positive");
}

void check_batchnorm_wiring(const Op& op, const Workspace& ws, const ParamStore& params,
                            int64_t numel, int channels) {
  expect_arity(op, 1, 1, 4);
  expect_numel(ws.values[op.inputs[0]], numel, op, "x");
  expect_numel(ws.values[op.outputs[0]], numel, op, "y");
  expect_numel(params[op.params[0]].value, channels, op, "weight");
  expect_numel(params[op.params[1]].value, channels, op, "bias");
  expect_numel(params[op.params[2]].value, channels, op, "running_mean");
  expect_numel(params[op.params[3]].value, channels, op, "running_var");
}

void batchnorm_op_forward_train(const Op& op, Workspace& ws, ParamStore& params, float* saved_mean,
                                float* saved_invstd, int64_t rows, int channels, float momentum,
                                float eps, BatchNormActivation activation,
                                BatchNormScratch& scratch) {
  check_batchnorm_wiring(op, ws, params, rows * channels, channels);
  Tensor& y = ws.values[op.outputs[0]];
  if (y.dtype() == DType::kBF16) {
    FT_CHECK(ws.device == Device::kCpu, op.kind(), " '", op.name, "': bf16 on ",
             device_name(ws.device), " is not built; set train.precision: fp32");
    batchnorm_forward_train(y.bf16_data(), saved_mean, saved_invstd,
                            params[op.params[2]].value.data(), params[op.params[3]].value.data(),
                            ws.values[op.inputs[0]].data(), params[op.params[0]].value.data(),
                            params[op.params[1]].value.data(), rows, channels, momentum, eps,
                            activation, scratch);
    return;
  }
  if (ws.device == Device::kCuda) ensure_batchnorm_device_scratch(scratch, rows, channels);
  FT_RUN_ON_CUDA(ws, batchnorm_forward_train_cuda(
                         ws.values[op.outputs[0]].data(), scratch.device_saved.data(),
                         scratch.device_saved.data() + channels, params[op.params[2]].value.data(),
                         params[op.params[3]].value.data(), scratch.device_partials.data(),
                         scratch.device_coefficients.data(), ws.values[op.inputs[0]].data(),
                         params[op.params[0]].value.data(), params[op.params[1]].value.data(), rows,
                         channels, momentum, eps, activation, ws.stream));
  batchnorm_forward_train(ws.values[op.outputs[0]].data(), saved_mean, saved_invstd,
                          params[op.params[2]].value.data(), params[op.params[3]].value.data(),
                          ws.values[op.inputs[0]].data(), params[op.params[0]].value.data(),
                          params[op.params[1]].value.data(), rows, channels, momentum, eps,
                          activation, scratch);
}

void batchnorm_op_backward(const Op& op, Workspace& ws, ParamStore& params, const float* saved_mean,
                           const float* saved_invstd, int64_t rows, int channels,
                           BatchNormActivation activation, BatchNormScratch& scratch) {
  // Only cuda reads y (the CPU recomputes the mask), and y may be bf16 only on the CPU.
  [[maybe_unused]] const float* relu_output =
      activation == BatchNormActivation::kRelu && ws.device == Device::kCuda
          ? ws.values[op.outputs[0]].data()
          : nullptr;
  FT_RUN_ON_CUDA(
      ws, batchnorm_backward_cuda(
              ws.grads[op.inputs[0]].data(), params[op.params[0]].grad.data(),
              params[op.params[1]].grad.data(), scratch.device_partials.data(),
              scratch.device_coefficients.data(), ws.grads[op.outputs[0]].data(), relu_output,
              ws.values[op.inputs[0]].data(), params[op.params[0]].value.data(),
              scratch.device_saved.data(), scratch.device_saved.data() + channels, rows, channels,
              ws.grad_is_fresh(op.inputs[0]), ws.stream));
  // The CPU recomputes BatchNormReluOp's mask from x (BatchNormMask::kRecomputed); CUDA reads y.
  const BatchNormMask mask =
      activation == BatchNormActivation::kRelu ? BatchNormMask::kRecomputed : BatchNormMask::kNone;
  batchnorm_backward(ws.grads[op.inputs[0]].data(), params[op.params[0]].grad.data(),
                     params[op.params[1]].grad.data(), ws.grads[op.outputs[0]].data(), mask,
                     nullptr, ws.values[op.inputs[0]].data(), params[op.params[0]].value.data(),
                     params[op.params[1]].value.data(), saved_mean, saved_invstd, rows, channels,
                     ws.grad_is_fresh(op.inputs[0]), scratch);
}

void batchnorm_op_forward_inference(const Op& op, Workspace& ws, ParamStore& params, int64_t rows,
                                    int channels, float eps, BatchNormActivation activation,
                                    BatchNormScratch& scratch) {
  check_batchnorm_wiring(op, ws, params, rows * channels, channels);
  FT_RUN_ON_CUDA(ws, batchnorm_forward_inference_cuda(
                         ws.values[op.outputs[0]].data(), ws.values[op.inputs[0]].data(),
                         params[op.params[0]].value.data(), params[op.params[1]].value.data(),
                         params[op.params[2]].value.data(), params[op.params[3]].value.data(), rows,
                         channels, eps, activation, ws.stream));
  batchnorm_forward_inference(ws.values[op.outputs[0]].data(), ws.values[op.inputs[0]].data(),
                              params[op.params[0]].value.data(), params[op.params[1]].value.data(),
                              params[op.params[2]].value.data(), params[op.params[3]].value.data(),
                              rows, channels, eps, activation, scratch);
}

OpCost batchnorm_cost(const Op& op, const Graph& graph, int channels, bool batch_statistics) {
  OpCost cost = op.Op::cost(graph);
  const double numel = static_cast<double>(graph.numel(op.inputs[0]));
  cost.bytes_read += 4.0 * 4.0 * channels;  // gamma, beta, running mean and variance
  if (!batch_statistics) {
    cost.forward_flops = 2.0 * numel;  // one multiply-add per element
    return cost;
  }
  // The reduction (subtract, add, multiply-add) reads x a second time; so does backward's.
  cost.forward_flops = 6.0 * numel;
  cost.backward_flops = 9.0 * numel;
  cost.bytes_read += 4.0 * numel;
  cost.saved_bytes = 2.0 * 4.0 * channels;  // mean and invstd
  return cost;
}

BatchNormTrainOp::BatchNormTrainOp(const char* kind, BatchNormActivation activation, int batch,
                                   int channels, int height, int width, float momentum, float eps)
    : activation_(activation),
      batch_(batch),
      channels_(channels),
      height_(height),
      width_(width),
      rows_(static_cast<int64_t>(batch) * height * width),
      momentum_(momentum),
      eps_(eps) {
  check_batchnorm_sizes(kind, batch, channels, height, width, 2, momentum, eps);
  saved_mean_.assign(channels, 0.0f);
  saved_invstd_.assign(channels, 0.0f);
}

void BatchNormTrainOp::forward(Workspace& ws, ParamStore& params) {
  batchnorm_op_forward_train(*this, ws, params, saved_mean_.data(), saved_invstd_.data(), rows_,
                             channels_, momentum_, eps_, activation_, scratch_);
  forward_ran_ = true;
}

// With kRelu, dz = dy * [z > 0] is formed on the fly inside both of batchnorm_backward's passes.
void BatchNormTrainOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(forward_ran_, kind(), " '", name, "': backward before forward");
  batchnorm_op_backward(*this, ws, params, saved_mean_.data(), saved_invstd_.data(), rows_,
                        channels_, activation_, scratch_);
}

BatchNorm2dOp::BatchNorm2dOp(int batch, int channels, int height, int width, float momentum,
                             float eps)
    : BatchNormTrainOp("batchnorm2d", BatchNormActivation::kNone, batch, channels, height, width,
                       momentum, eps) {}

OpCost BatchNorm2dOp::cost(const Graph& graph) const {
  return batchnorm_cost(*this, graph, channels(), /*batch_statistics=*/true);
}

}  // namespace ft
