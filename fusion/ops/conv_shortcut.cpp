// ConvShortcutOp on a private Conv2dOp (model/ops/conv2d.h), which reads x in place through a
// wrapped tensor. Its output rows interleave the branches ([y3 | y1] per pixel), so forward
// splits them into the two output values and backward interleaves dy3 and dy1 back; both copies
// are 2 * B*Ho*Wo*Cout floats, small beside the convolution.
#include "fusion/ops/conv_shortcut.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

constexpr int kKernel = 3;
constexpr int kTaps = kKernel * kKernel;
constexpr int kCentreTap = kTaps / 2;  // (1, 1)

// Copies `width`-float runs between a [rows, 2 width] interleaved buffer and two [rows, width]
// ones: split writes first/second from combined, merge the reverse.
void split_rows(float* first, float* second, const float* combined, int64_t rows, int width) {
  const size_t bytes = static_cast<size_t>(width) * sizeof(float);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(first + r * width, combined + 2 * r * width, bytes);
    std::memcpy(second + r * width, combined + (2 * r + 1) * width, bytes);
  }
}
void merge_rows(float* combined, const float* first, const float* second, int64_t rows, int width) {
  const size_t bytes = static_cast<size_t>(width) * sizeof(float);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(combined + 2 * r * width, first + r * width, bytes);
    std::memcpy(combined + (2 * r + 1) * width, second + r * width, bytes);
  }
}

int out_size(int size, int stride) {
  return (size - 1) / stride + 1;
}

}  // namespace

ConvShortcutOp::ConvShortcutOp(int batch, int in_channels, int out_channels, int height, int width,
                               int stride)
    : batch_(batch),
      in_channels_(in_channels),
      out_channels_(out_channels),
      height_(height),
      width_(width),
      stride_(stride),
      combined_(batch, in_channels, 2 * out_channels, height, width, kKernel, stride,
                /*padding=*/1) {
  place_on(Device::kCpu, nullptr);
  combined_.inputs = {0};
  combined_.outputs = {1};
  combined_.params = {0};
  combined_ws_.values.resize(2);
  combined_ws_.grads.resize(2);
  combined_ws_.row_strides = {in_channels, 2 * out_channels};
  combined_ws_.grad_fresh.assign(2, 0);
  combined_ws_.values[1] = combined_output_;
  combined_ws_.grads[1] = combined_output_;
}

void ConvShortcutOp::place_on(Device device, CudaStream stream, bool bf16_copy) {
  combined_ws_.stream = stream;
  if (packed_weight_ && packed_weight_->device() == device &&
      packed_weight_->has_bf16_copies() == bf16_copy)
    return;
  packed_weight_ = std::make_unique<ParamStore>();
  // Trainable, so that a bf16 copy exists for it; nothing optimizes this private store.
  packed_weight_->add("packed_weight", combined_.weight_shape(), ParamInit::kZeros, 0.0f, false);
  if (bf16_copy) packed_weight_->enable_bf16_copies();
  packed_weight_->allocate(device);
  combined_output_ = Tensor::empty(combined_.output_shape(), device);
  combined_ws_.device = device;
  if (!combined_ws_.values.empty()) {
    combined_ws_.values[1] = combined_output_;
    combined_ws_.grads[1] = combined_output_;
  }
}

Shape ConvShortcutOp::output_shape() const {
  return {batch_, out_size(height_, stride_), out_size(width_, stride_), out_channels_};
}

void ConvShortcutOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  expect_arity(*this, 1, 2, 2);
  const int64_t output_numel = shape_numel(output_shape());
  expect_numel(ws.values[inputs[0]], static_cast<int64_t>(batch_) * height_ * width_ * in_channels_,
               *this, "x");
  expect_numel(ws.values[outputs[0]], output_numel, *this, "y (3x3)");
  expect_numel(ws.values[outputs[1]], output_numel, *this, "y (1x1 shortcut)");
  expect_numel(params[this->params[0]].value,
               static_cast<int64_t>(out_channels_) * in_channels_ * kTaps, *this, "3x3 weight");
  expect_numel(params[this->params[1]].value, static_cast<int64_t>(out_channels_) * in_channels_,
               *this, "1x1 weight");
}

// W[o] = w3[o] for o < Cout; W[Cout + o, c] = w1[o, c] at the centre tap, 0 at the other eight.
void ConvShortcutOp::pack_weights(const float* w3, const float* w1) {
  float* packed = (*packed_weight_)[0].value.data();
  const int64_t branch = static_cast<int64_t>(out_channels_) * in_channels_ * kTaps;
  std::copy(w3, w3 + branch, packed);
  float* shortcut = packed + branch;
  std::fill(shortcut, shortcut + branch, 0.0f);
  for (int64_t oc = 0; oc < static_cast<int64_t>(out_channels_) * in_channels_; ++oc)
    shortcut[oc * kTaps + kCentreTap] = w1[oc];
}

void ConvShortcutOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  if (!configured_) {
    combined_.name = name + ".combined";
    combined_.algorithm = algorithm;
    combined_.winograd_tile = winograd_tile;
    configured_ = true;
  }
  combined_.needs_input_grad = needs_input_grad;
  const bool bf16 = ws.values[inputs[0]].dtype() == DType::kBF16;
  FT_RUN_ON_CUDA(ws, forward_cuda(ws, params, bf16));
  place_on(Device::kCpu, nullptr, bf16);
  pack_weights(params[this->params[0]].value.data(), params[this->params[1]].value.data());
  // New weights every forward: the combined convolution must not reuse what it derived from the
  // last ones (an eval graph runs no backward, which would invalidate them).
  packed_weight_->mark_changed();
  if (bf16) packed_weight_->refresh_bf16_copies();
  combined_ws_.values[0] = combined_input(ws);
  combined_.forward(combined_ws_, *packed_weight_);
  const int64_t pixels = shape_numel(output_shape()) / out_channels_;
  split_rows(ws.values[outputs[0]].data(), ws.values[outputs[1]].data(), combined_output_.data(),
             pixels, out_channels_);
}

// dW is formed whole in the packed gradient (zeroed first: the convolution accumulates), then
// added into the two canonical gradients; the packed value W still holds forward's weights.
void ConvShortcutOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(configured_, "conv_shortcut '", name, "': backward before forward");
  FT_RUN_ON_CUDA(ws, backward_cuda(ws, params));
  const int64_t pixels = shape_numel(output_shape()) / out_channels_;
  merge_rows(combined_output_.data(), ws.grads[outputs[0]].data(), ws.grads[outputs[1]].data(),
             pixels, out_channels_);
  combined_ws_.values[0] = combined_input(ws);
  if (needs_input_grad) {
    combined_ws_.grads[0] = Tensor::wrap(ws.grads[inputs[0]].data(), combined_.input_shape());
    combined_ws_.grad_fresh[0] = ws.grad_is_fresh(inputs[0]) ? 1 : 0;
  }
  Tensor& packed_grad = (*packed_weight_)[0].grad;
  packed_grad.fill(0.0f);
  combined_.backward(combined_ws_, *packed_weight_);

  const float* dw = packed_grad.data();
  const int64_t branch = static_cast<int64_t>(out_channels_) * in_channels_ * kTaps;
  float* dw3 = params[this->params[0]].grad.data();
  for (int64_t i = 0; i < branch; ++i) dw3[i] += dw[i];
  float* dw1 = params[this->params[1]].grad.data();
  for (int64_t oc = 0; oc < static_cast<int64_t>(out_channels_) * in_channels_; ++oc)
    dw1[oc] += dw[branch + oc * kTaps + kCentreTap];
}

Tensor ConvShortcutOp::combined_input(const Workspace& ws) const {
  const Tensor& x = ws.values[inputs[0]];
  // Tensor::wrap takes a mutable pointer; the convolution only reads x.
  if (x.dtype() == DType::kBF16)
    return Tensor::wrap(const_cast<bf16_bits*>(x.bf16_data()), combined_.input_shape(), ws.device);
  return Tensor::wrap(const_cast<float*>(x.data()), combined_.input_shape(), ws.device);
}

OpCost ConvShortcutOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);  // x, y3, y1
  // The padded convolution: 2 Cout outputs of 9 taps each, useful or not.
  const double macs = static_cast<double>(shape_numel(output_shape())) * 2.0 * in_channels_ * kTaps;
  cost.forward_flops = 2.0 * macs;
  cost.backward_flops = (needs_input_grad ? 4.0 : 2.0) * macs;
  // Both canonical weights (their bf16 copies for a bf16 x), and the combined output written by
  // the convolution and read back.
  const double combined_bytes = 2.0 * 4.0 * static_cast<double>(shape_numel(output_shape()));
  cost.bytes_read +=
      graph.element_bytes(inputs[0]) * out_channels_ * in_channels_ * (kTaps + 1) + combined_bytes;
  cost.bytes_written += combined_bytes;
  return cost;
}

}  // namespace ft
