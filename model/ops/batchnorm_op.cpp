// The BatchNorm op family's shared wiring (checks, the branch of tensors the kernels of
// kernels/batchnorm.h run on, costs) and BatchNorm2dOp itself.
#include "core/check.h"
#include "model/ops/batchnorm.h"
#include "model/ops/op_checks.h"

namespace ft {

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

BatchNormBranch batchnorm_branch(const Op& op, int which, Workspace& ws, ParamStore& params,
                                 int64_t rows, int channels, float momentum, float eps,
                                 float* saved_mean, float* saved_invstd,
                                 BatchNormScratch& scratch) {
  const size_t first = 4 * static_cast<size_t>(which);
  BatchNormBranch b;
  b.x = ws.values[op.inputs[which]].data();
  b.gamma = params[op.params[first]].value.data();
  b.beta = params[op.params[first + 1]].value.data();
  b.running_mean = params[op.params[first + 2]].value.data();
  b.running_var = params[op.params[first + 3]].value.data();
  b.momentum = momentum;
  b.eps = eps;
  if (ws.device == Device::kCuda) {
    ensure_batchnorm_device_scratch(scratch, rows, channels);
    b.saved_mean = scratch.device_saved.data();
    b.saved_invstd = scratch.device_saved.data() + channels;
    b.partials = scratch.device_partials.data();
    b.coefficients = scratch.device_coefficients.data();
  } else {
    b.saved_mean = saved_mean;
    b.saved_invstd = saved_invstd;
  }
  return b;
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

BatchNormTrainOp::BatchNormTrainOp(const char* kind, int batch, int channels, int height, int width,
                                   float momentum, float eps)
    : batch_(batch),
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

BatchNormBranch BatchNormTrainOp::branch(Workspace& ws, ParamStore& params) {
  return batchnorm_branch(*this, 0, ws, params, rows_, channels_, momentum_, eps_,
                          saved_mean_.data(), saved_invstd_.data(), scratch_);
}

void BatchNormTrainOp::forward(Workspace& ws, ParamStore& params) {
  check_batchnorm_wiring(*this, ws, params, rows_ * channels_, channels_);
  forward_impl(ws, branch(ws, params), scratch_);
  forward_ran_ = true;
}

void BatchNormTrainOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(forward_ran_, kind(), " '", name, "': backward before forward");
  BatchNormBranch b = branch(ws, params);
  b.dx = ws.grads[inputs[0]].data();
  b.dx_fresh = ws.grad_is_fresh(inputs[0]);
  b.dgamma = params[this->params[0]].grad.data();
  b.dbeta = params[this->params[1]].grad.data();
  backward_impl(ws, b, scratch_);
}

BatchNorm2dOp::BatchNorm2dOp(int batch, int channels, int height, int width, float momentum,
                             float eps)
    : BatchNormTrainOp("batchnorm2d", batch, channels, height, width, momentum, eps) {}

void BatchNorm2dOp::forward_impl(Workspace& ws, const BatchNormBranch& b,
                                 BatchNormScratch& scratch) {
  float* y = ws.values[outputs[0]].data();
  FT_RUN_ON_CUDA(ws, batchnorm_forward_train_cuda(y, b, rows(), channels(), ws.stream));
  batchnorm_forward_train(y, b, rows(), channels(), scratch);
}

void BatchNorm2dOp::backward_impl(Workspace& ws, const BatchNormBranch& b,
                                  BatchNormScratch& scratch) {
  const float* dy = ws.grads[outputs[0]].data();
  FT_RUN_ON_CUDA(ws, batchnorm_backward_cuda(dy, b, rows(), channels(), ws.stream));
  batchnorm_backward(dy, b, rows(), channels(), scratch);
}

OpCost BatchNorm2dOp::cost(const Graph& graph) const {
  return batchnorm_cost(*this, graph, channels(), /*batch_statistics=*/true);
}

}  // namespace ft
