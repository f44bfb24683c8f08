// BatchNormAddReluOp's wiring: the branches and the identity shortcut on the workspace's device,
// the checks, and the dispatch to the CPU functions (batchnorm_add_relu.cpp) or the CUDA ones
// (batchnorm_add_relu.cu; with a bf16 y compiled, not yet run on a GPU).
#include "core/bf16_cast.h"
#include "core/check.h"
#if defined(FT_HAVE_CUDA)
#include "core/cuda/bf16_kernels.h"
#endif
#include "fusion/ops/batchnorm_add_relu.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

constexpr int kParamsPerBatchNorm = 4;

}  // namespace

BatchNormAddReluOp::BatchNormAddReluOp(int batch, int channels, int height, int width,
                                       BatchNormSettings main, const BatchNormSettings* shortcut_bn)
    : batch_(batch),
      channels_(channels),
      height_(height),
      width_(width),
      rows_(static_cast<int64_t>(batch) * height * width),
      normalised_shortcut_(shortcut_bn != nullptr),
      settings_{main, shortcut_bn != nullptr ? *shortcut_bn : main} {
  for (const BatchNormSettings& s : settings_)
    check_batchnorm_sizes("batchnorm_add_relu", batch, channels, height, width, 2, s.momentum,
                          s.eps);
  for (int which = 0; which < 2; ++which) {
    saved_mean_[which].assign(channels, 0.0f);
    saved_invstd_[which].assign(channels, 0.0f);
  }
}

void BatchNormAddReluOp::check_wiring(const Workspace& ws, const ParamStore& store) const {
  const int batchnorms = normalised_shortcut_ ? 2 : 1;
  expect_arity(*this, 2, 1, kParamsPerBatchNorm * batchnorms);
  FT_CHECK(inputs[0] != inputs[1], kind(), " '", name, "': both inputs are value ", inputs[0]);
  const int64_t numel = rows_ * channels_;
  expect_numel(ws.values[inputs[0]], numel, *this, "x");
  expect_numel(ws.values[inputs[1]], numel, *this, normalised_shortcut_ ? "x_s" : "r");
  expect_numel(ws.values[outputs[0]], numel, *this, "y");
  static const char* const kRoles[] = {"weight", "bias", "running_mean", "running_var"};
  for (size_t p = 0; p < params.size(); ++p)
    expect_numel(store[params[p]].value, channels_, *this, kRoles[p % kParamsPerBatchNorm]);
}

BatchNormBranch BatchNormAddReluOp::branch(int which, Workspace& ws, ParamStore& store) {
  const ValueId input = inputs[which];
  const size_t first = static_cast<size_t>(kParamsPerBatchNorm) * which;
  BatchNormBranch b = batchnorm_branch(
      *this, which, ws, store, rows_, channels_, settings_[which].momentum, settings_[which].eps,
      saved_mean_[which].data(), saved_invstd_[which].data(), scratch_[which]);
  if (ws.grads[input].defined()) {
    b.dx = ws.grads[input].data();
    b.dx_fresh = ws.grad_is_fresh(input);
  }
  b.dgamma = store[params[first]].grad.data();
  b.dbeta = store[params[first + 1]].grad.data();
  return b;
}

BatchNormAddReluIdentity BatchNormAddReluOp::identity(Workspace& ws) const {
  BatchNormAddReluIdentity identity;
  if (normalised_shortcut_) return identity;
  identity.r = ws.values[inputs[1]].data();
  if (ws.grads[inputs[1]].defined()) {
    identity.dr = ws.grads[inputs[1]].data();
    identity.dr_fresh = ws.grad_is_fresh(inputs[1]);
  }
  return identity;
}

void BatchNormAddReluOp::forward(Workspace& ws, ParamStore& store) {
  check_wiring(ws, store);
  const BatchNormBranch main = branch(0, ws, store);
  BatchNormBranch shortcut_bn;
  if (normalised_shortcut_) shortcut_bn = branch(1, ws, store);
  const BatchNormBranch* shortcut = normalised_shortcut_ ? &shortcut_bn : nullptr;
  forward_ran_ = true;
  Tensor& y = ws.values[outputs[0]];
  if (y.dtype() == DType::kBF16) {
    FT_RUN_ON_CUDA(ws, batchnorm_add_relu_forward_cuda(y.bf16_data(), main, shortcut, identity(ws),
                                                       rows_, channels_, ws.stream));
    batchnorm_add_relu_forward(y.bf16_data(), main, shortcut, identity(ws), rows_, channels_,
                               scratch_);
    return;
  }
  FT_RUN_ON_CUDA(ws, batchnorm_add_relu_forward_cuda(y.data(), main, shortcut, identity(ws), rows_,
                                                     channels_, ws.stream));
  batchnorm_add_relu_forward(y.data(), main, shortcut, identity(ws), rows_, channels_, scratch_);
}

// The identity shortcut's mask reads y; a bf16 y is widened for it. Rounding keeps every sign and
// the process flushes denormals to zero (core/denormals.h), so the mask is the fp32 twin's. cuda
// reads the mask from y for both shortcuts, so widens it for both.
const float* BatchNormAddReluOp::relu_output(const Workspace& ws) {
  const Tensor& y = ws.values[outputs[0]];
  if (y.dtype() == DType::kF32) return y.data();
#if defined(FT_HAVE_CUDA)
  if (ws.device == Device::kCuda) {
    if (widened_output_device_.numel() != y.numel())
      widened_output_device_ = Tensor::empty({y.numel()}, Device::kCuda);
    cuda_widen_bf16(widened_output_device_.data(), y.bf16_data(), y.numel(), ws.stream);
    return widened_output_device_.data();
  }
#endif
  if (normalised_shortcut_) return nullptr;
  widened_output_.resize(static_cast<size_t>(y.numel()));
  cast_to_float(widened_output_.data(), y.bf16_data(), y.numel());
  return widened_output_.data();
}

void BatchNormAddReluOp::backward(Workspace& ws, ParamStore& store) {
  FT_CHECK(forward_ran_, kind(), " '", name, "': backward before forward");
  check_wiring(ws, store);
  const BatchNormBranch main = branch(0, ws, store);
  FT_CHECK(main.dx != nullptr, kind(), " '", name, "': x has no gradient buffer");
  BatchNormBranch shortcut_bn;
  if (normalised_shortcut_) shortcut_bn = branch(1, ws, store);
  const BatchNormBranch* shortcut = normalised_shortcut_ ? &shortcut_bn : nullptr;
  const float* dy = ws.grads[outputs[0]].data();
  const float* y = relu_output(ws);
  FT_RUN_ON_CUDA(ws, batchnorm_add_relu_backward_cuda(dy, y, main, shortcut, identity(ws), rows_,
                                                      channels_, ws.stream));
  batchnorm_add_relu_backward(dy, y, main, shortcut, identity(ws), rows_, channels_, scratch_);
}

OpCost BatchNormAddReluOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double numel = static_cast<double>(rows_) * channels_;
  const int batchnorms = normalised_shortcut_ ? 2 : 1;
  cost.bytes_read += 4.0 * 4.0 * channels_ * batchnorms;  // the per-channel params
  // Per BatchNorm the reduction re-reads its x (6 FLOPs) and the normalisation is 2; then the
  // add and the max. Backward: the masked reduction (4) and input gradient (6) per BatchNorm,
  // the mask and the shortcut's copy.
  cost.bytes_read += 4.0 * numel * batchnorms;
  cost.forward_flops = (8.0 * batchnorms + 2.0) * numel;
  cost.backward_flops = (10.0 * batchnorms + 2.0) * numel;
  cost.saved_bytes = 2.0 * 4.0 * channels_ * batchnorms;
  return cost;
}

}  // namespace ft
