// Inverted dropout with a counter-based mask (see dropout.h for the contract).
#include "model/ops/dropout.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/dropout_math.h"
#include "model/ops/op_checks.h"

namespace ft {

void dropout_forward(float* y, uint8_t* keep_mask, const float* x, float p, uint64_t seed,
                     int64_t numel) {
  const float scale = dropout_scale(p);
#pragma omp parallel for if (numel > 65536)
  for (int64_t i = 0; i < numel; ++i) {
    const bool keep = dropout_keep(seed, static_cast<uint64_t>(i), p);
    keep_mask[i] = keep ? 1 : 0;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
}

// y = x * keep / (1 - p) is linear in x with a fixed mask: dx = dy * keep / (1 - p).
void dropout_backward(float* dx, const float* dy, const uint8_t* keep_mask, float p,
                      int64_t numel) {
  const float scale = dropout_scale(p);
  for (int64_t i = 0; i < numel; ++i) dx[i] += keep_mask[i] ? dy[i] * scale : 0.0f;
}

DropoutOp::DropoutOp(int64_t numel, float p, uint64_t salt) : numel_(numel), p_(p), salt_(salt) {
  FT_CHECK(numel > 0, "DropoutOp: non-positive numel ", numel);
  FT_CHECK(std::isfinite(p) && p >= 0.0f && p < 1.0f, "DropoutOp: dropout probability ", p,
           " is outside [0, 1)");
}

void DropoutOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 1, 1, 0);
  expect_numel(ws.values[inputs[0]], numel_, *this, "input x");
  expect_numel(ws.values[outputs[0]], numel_, *this, "output y");
}

void DropoutOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  const float* x = ws.values[inputs[0]].data();
  float* y = ws.values[outputs[0]].data();
  masked_ = p_ > 0.0f;  // train graphs only: eval graphs are built without dropout ops
  if (!masked_) {
    ws.values[outputs[0]].copy_from(ws.values[inputs[0]]);  // an identity copy on either device
    return;
  }
  if (keep_mask_.numel() != (numel_ + 3) / 4 || keep_mask_.device() != ws.device)
    keep_mask_ = Tensor::empty({(numel_ + 3) / 4}, ws.device);
  FT_RUN_ON_CUDA(ws, dropout_forward_cuda(y, keep_mask_bytes(), x, p_, ws.device_dropout_seed(),
                                          salt_, numel_, ws.stream));
  dropout_forward(y, keep_mask_bytes(), x, p_, ws.dropout_seed ^ salt_, numel_);
}

void DropoutOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  float* dx = ws.grads[inputs[0]].data();
  const float* dy = ws.grads[outputs[0]].data();
  FT_CHECK(!masked_ || keep_mask_.device() == ws.device, "dropout '", name,
           "': backward on another device than forward");
  FT_RUN_ON_CUDA(ws, dropout_backward_cuda(dx, dy, masked_ ? keep_mask_bytes() : nullptr, p_,
                                           numel_, ws.stream));
  if (!masked_) {
    for (int64_t i = 0; i < numel_; ++i) dx[i] += dy[i];
    return;
  }
  dropout_backward(dx, dy, keep_mask_bytes(), p_, numel_);
}

std::vector<uint8_t> DropoutOp::keep_mask() const {
  if (!masked_) return {};
  const std::vector<float> words = keep_mask_.to_host_vector();
  std::vector<uint8_t> bytes(static_cast<size_t>(numel_));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

OpCost DropoutOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  if (p_ == 0.0f) return cost;  // an identity copy
  const double elements = static_cast<double>(numel_);
  cost.forward_flops = 2 * elements;  // compare against p, scale
  cost.backward_flops = elements;
  cost.bytes_written += elements;  // the byte mask
  cost.saved_bytes = elements;
  return cost;
}

}  // namespace ft
