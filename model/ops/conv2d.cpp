// Conv2dOp's passes on the primitives conv2d_primitives.cpp builds. Forward runs either as
// convolution_forward or, for stride-1 "same" convolutions, as the backward-data primitive of the
// flipped kernel. 3x3 "same" convolutions with 16k channels run all three passes on our Winograd
// kernels instead (see ConvAlgorithm).
//
// Backward, with dy = dL/dy:
//   dx[b,c,h,w]   += sum_{o,p,q : h = i*S+p-P, w = j*S+q-P} w[o,c,p,q] * dy[b,o,i,j]
//                    (a transposed convolution of dy; convolution_backward_data)
//   dw[o,c,p,q]   += sum_{b,i,j} dy[b,o,i,j] * x[b, c, i*S+p-P, j*S+q-P]
//                    (a correlation of x with dy; convolution_backward_weights)
// oneDNN writes (=) both results and backward primitives take no sum post-op, so dx goes into a
// scratch buffer and a vectorised loop adds it into ours (it may already hold the shortcut's
// gradient), and dw into a blocked buffer that a reorder with a sum post-op adds into the oihw
// gradient (which may hold an earlier micro-batch's). The dx scratch is one per thread, shared by
// every convolution, so it stays in cache; a buffer per op (19 of up to 3 MB in resnet20) is cold
// each time, which cost ~1% of a resnet20 step. When the executor hands over a fresh gradient
// (Op::overwrites_fresh_input_grads), dx goes straight into it and nothing is added or zeroed.
//
// bf16 (a bf16 x): the weight is the parameter's bf16 copy and dy is rounded to bf16 once per
// backward, as for a Linear. The native primitives read those directly; the widening path widens
// x and the weight copy and rounds dy through bf16, then runs the fp32 passes above, so both see
// the same rounded values and differ only in fp32 accumulation order.
#include "model/ops/conv2d.h"

#include <dnnl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/device.h"
#include "core/dnnl_context.h"
#include "model/ops/conv2d_primitives.h"
#include "model/ops/linear.h"
#include "model/ops/op_checks.h"
#include "model/ops/winograd.h"

namespace ft {
namespace {

using conv2d_detail::Scratch;
using conv2d_detail::thread_scratch;

const bf16_bits* bf16_weight(const Param& weight) {
  return static_cast<const bf16_bits*>(weight_operand(weight, 0, DType::kBF16).data);
}

// `count` bf16 values widened into a per-thread scratch slot.
float* widen(Scratch slot, const bf16_bits* values, int64_t count) {
  float* wide = thread_scratch(slot, count);
  cast_to_float(wide, values, count);
  return wide;
}

// out = the fp32 value of bf16(in): what the native path's bf16 copy of dy holds.
void round_through_bf16(float* out, const float* in, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = round_to_bf16(in[i]);
}

// dst += src elementwise. Both hold the same layout, so no index arithmetic is needed.
void add_into(float* dst, const float* src, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] += src[i];
}

// flipped[c][o][K-1-p][K-1-q] = w[o][c][p][q]: the kernel of the transposed forward.
void flip_kernel(float* flipped, const float* w, int out_channels, int in_channels, int kernel) {
  const int taps = kernel * kernel;
  for (int o = 0; o < out_channels; ++o)
    for (int c = 0; c < in_channels; ++c) {
      const float* from = w + (static_cast<int64_t>(o) * in_channels + c) * taps;
      float* to = flipped + (static_cast<int64_t>(c) * out_channels + o) * taps;
      for (int t = 0; t < taps; ++t) to[taps - 1 - t] = from[t];
    }
}

}  // namespace

Conv2dOp::Conv2dOp(int batch, int in_channels, int out_channels, int height, int width, int kernel,
                   int stride, int padding)
    : batch_(batch),
      in_channels_(in_channels),
      out_channels_(out_channels),
      height_(height),
      width_(width),
      kernel_(kernel),
      stride_(stride),
      padding_(padding) {
  FT_CHECK(batch > 0 && in_channels > 0 && out_channels > 0 && height > 0 && width > 0 &&
               kernel > 0 && stride > 0 && padding >= 0,
           "conv2d: bad sizes batch=", batch, " in=", in_channels, " out=", out_channels,
           " height=", height, " width=", width, " kernel=", kernel, " stride=", stride,
           " padding=", padding);
  FT_CHECK(height + 2 * padding >= kernel && width + 2 * padding >= kernel, "conv2d: kernel ",
           kernel, " larger than the padded input ", height, "x", width, " (padding ", padding,
           ")");
  out_height_ = (height + 2 * padding - kernel) / stride + 1;
  out_width_ = (width + 2 * padding - kernel) / stride + 1;
}

Conv2dOp::~Conv2dOp() = default;

WinogradShape Conv2dOp::winograd_shape() const {
  return {batch_, height_, width_, in_channels_, out_channels_, winograd_tile};
}

Shape Conv2dOp::input_shape() const {
  if (input_layout == ActivationLayout::kNchw) return {batch_, in_channels_, height_, width_};
  return {batch_, height_, width_, in_channels_};
}

bool Conv2dOp::winograd_applies() const {
  const bool same = stride_ == 1 && 2 * padding_ == kernel_ - 1;
  return same && kernel_ == 3 && input_layout == ActivationLayout::kNhwc &&
         winograd_supports(in_channels_, out_channels_);
}

ConvAlgorithm Conv2dOp::resolved_algorithm() const {
  const bool nhwc = input_layout == ActivationLayout::kNhwc;
  const bool same = stride_ == 1 && 2 * padding_ == kernel_ - 1;
  const bool transposed_applies = same && in_channels_ >= 8 && nhwc;
  switch (algorithm) {
    case ConvAlgorithm::kAuto:
      if (winograd_applies()) return ConvAlgorithm::kWinograd;
      [[fallthrough]];
    case ConvAlgorithm::kOneDnn:
    case ConvAlgorithm::kMeasure:  // Winograd is its alternative (make_measured_alternative)
      return transposed_applies ? ConvAlgorithm::kTransposed : ConvAlgorithm::kDirect;
    case ConvAlgorithm::kDirect:
      return ConvAlgorithm::kDirect;
    case ConvAlgorithm::kTransposed:
      FT_CHECK(transposed_applies, "conv2d '", name, "': the transposed forward needs stride 1, ",
               "padding (kernel-1)/2, NHWC input and at least 8 input channels; got stride ",
               stride_, ", kernel ", kernel_, ", padding ", padding_, ", ", in_channels_,
               " channels");
      return ConvAlgorithm::kTransposed;
    case ConvAlgorithm::kWinograd:
      FT_CHECK(winograd_applies(), "conv2d '", name, "': Winograd needs a 3x3 kernel, stride 1, ",
               "padding 1, NHWC input and channels that are multiples of 16; got kernel ", kernel_,
               ", stride ", stride_, ", padding ", padding_, ", ", in_channels_, " -> ",
               out_channels_, " channels");
      return ConvAlgorithm::kWinograd;
  }
  FT_FAIL("conv2d '", name, "': unknown algorithm");
}

const char* Conv2dOp::forward_impl() const {
  const Primitives* p = forward_choice_ != nullptr ? forward_choice_ : primitives_.get();
  return p != nullptr ? p->forward_impl.c_str() : "";
}

CudnnConvShape cudnn_conv_shape(int batch, int in_channels, int out_channels, int height, int width,
                                int kernel, int stride, int padding,
                                ActivationLayout input_layout) {
  CudnnConvShape shape;
  shape.batch = batch;
  shape.in_channels = in_channels;
  shape.out_channels = out_channels;
  shape.height = height;
  shape.width = width;
  shape.kernel = kernel;
  shape.stride = stride;
  shape.padding = padding;
  shape.out_height = (height + 2 * padding - kernel) / stride + 1;
  shape.out_width = (width + 2 * padding - kernel) / stride + 1;
  shape.nchw_input = input_layout == ActivationLayout::kNchw && in_channels > 1;
  return shape;
}

CudnnConvShape Conv2dOp::cudnn_shape() const {
  return cudnn_conv_shape(batch_, in_channels_, out_channels_, height_, width_, kernel_, stride_,
                          padding_, input_layout);
}

void Conv2dOp::run_forward(Primitives& p, float* y, const void* x, const void* weight,
                           const void* weight_source, uint64_t version) {
  const ConvTimeGuard timed;
  // The forward weights (transformed, flipped or reordered) are redone only when the parameters
  // may have changed: every train forward (ParamStore::version moves), but an eval graph between
  // optimizer steps reuses them, as an inference engine prepacks its weights.
  const bool weights_current = p.forward_weights_valid && p.forward_weights_version == version &&
                               p.forward_weights_source == weight_source;
  p.forward_weights_valid = true;
  p.forward_weights_version = version;
  p.forward_weights_source = weight_source;
  if (p.algorithm == ConvAlgorithm::kWinograd) {
    if (!weights_current)
      winograd_transform_weights(p.winograd_weights.data(), static_cast<const float*>(weight),
                                 out_channels_, in_channels_, winograd_tile,
                                 WinogradPass::kForward);
    winograd_conv(y, static_cast<const float*>(x), p.winograd_weights.data(), winograd_shape(),
                  WinogradWrite::kOverwrite);
    return;
  }
  p.src.set_data_handle(const_cast<void*>(x));
  p.dst.set_data_handle(y);
  if (p.algorithm == ConvAlgorithm::kTransposed) {
    if (!weights_current) {
      flip_kernel(p.flipped_weights.data(), static_cast<const float*>(weight), out_channels_,
                  in_channels_, kernel_);
      p.forward_weights.to_prim(p.flipped_weights.data());
    }
    p.forward_transposed.execute(cpu_stream(), {{DNNL_ARG_DIFF_DST, p.src},
                                                {DNNL_ARG_WEIGHTS, p.forward_weights.prim},
                                                {DNNL_ARG_DIFF_SRC, p.dst}});
  } else {
    if (!weights_current) p.forward_weights.to_prim(weight);
    p.forward.execute(
        cpu_stream(),
        {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_WEIGHTS, p.forward_weights.prim}, {DNNL_ARG_DST, p.dst}});
  }
  cpu_stream().wait();
}

void Conv2dOp::run_backward(Primitives& p, float* dx, bool dx_fresh, float* dweight, const void* dy,
                            const void* x, const void* weight) {
  const ConvTimeGuard timed;
  p.forward_weights_valid = false;
  if (p.algorithm == ConvAlgorithm::kWinograd) {
    const auto* x_data = static_cast<const float*>(x);
    const auto* dy_data = static_cast<const float*>(dy);
    winograd_conv_weight_grad(dweight, x_data, dy_data, winograd_shape());
    if (dx == nullptr) return;
    // dx is the forward of the transposed problem: dy's Cout channels in, Cin out.
    winograd_transform_weights(p.winograd_weights.data(), static_cast<const float*>(weight),
                               out_channels_, in_channels_, winograd_tile,
                               WinogradPass::kBackwardData);
    winograd_conv(dx, dy_data, p.winograd_weights.data(),
                  {batch_, height_, width_, out_channels_, in_channels_, winograd_tile},
                  dx_fresh ? WinogradWrite::kOverwrite : WinogradWrite::kAccumulate);
    return;
  }
  p.src.set_data_handle(const_cast<void*>(x));
  p.diff_dst.set_data_handle(const_cast<void*>(dy));

  // dw: correlate x with dy.
  p.backward_weights.execute(cpu_stream(), {{DNNL_ARG_SRC, p.src},
                                            {DNNL_ARG_DIFF_DST, p.diff_dst},
                                            {DNNL_ARG_DIFF_WEIGHTS, p.diff_weights_written}});
  p.diff_weights_user.set_data_handle(dweight);
  p.add_diff_weights.execute(cpu_stream(), p.diff_weights_written, p.diff_weights_user);

  if (dx != nullptr) {
    // dx: transposed convolution of dy with w, straight into a fresh gradient.
    const int64_t count = shape_numel(input_shape());
    float* written = dx_fresh ? dx : thread_scratch(Scratch::kInputGradient, count);
    p.diff_src_written.set_data_handle(written);
    p.data_weights.to_prim(weight);
    p.backward_data.execute(cpu_stream(), {{DNNL_ARG_DIFF_SRC, p.diff_src_written},
                                           {DNNL_ARG_WEIGHTS, p.data_weights.prim},
                                           {DNNL_ARG_DIFF_DST, p.diff_dst}});
    cpu_stream().wait();
    if (!dx_fresh) add_into(dx, written, count);
  }
  cpu_stream().wait();
}

void Conv2dOp::forward(Workspace& ws, ParamStore& params) {
  expect_arity(*this, 1, 1, 1);
  Tensor& x = ws.values[inputs[0]];
  Tensor& y = ws.values[outputs[0]];
  const Param& weight = params[this->params[0]];
  expect_numel(x, shape_numel(input_shape()), *this, "x");
  expect_numel(y, shape_numel(output_shape()), *this, "y");
  expect_numel(weight.value, shape_numel(weight_shape()), *this, "weight");
  if (x.dtype() == DType::kBF16)
    FT_RUN_ON_CUDA(ws, conv2d_forward_bf16_cuda(y.data(), x.bf16_data(), bf16_weight(weight),
                                                cudnn_conv(), ws.stream));
  FT_RUN_ON_CUDA(
      ws, conv2d_forward_cuda(y.data(), x.data(), weight.value.data(), cudnn_conv(), ws.stream));
  if (!primitives_) build_primitives(x.dtype());
  FT_CHECK(primitives_->input == x.dtype(), "conv2d '", name, "': built for a ",
           dtype_name(primitives_->input), " input, given ", dtype_name(x.dtype()));
  Primitives* p = alternative_ ? forward_choice_ : primitives_.get();
  if (p == nullptr) p = forward_choice_ = &measure_forward(y.data(), x, weight, params.version());
  forward_with(*p, y.data(), x, weight, params.version());
}

void Conv2dOp::forward_with(Primitives& p, float* y, const Tensor& x, const Param& weight,
                            uint64_t version) {
  if (x.dtype() == DType::kF32)
    return run_forward(p, y, x.data(), weight.value.data(), weight.value.data(), version);
  const bf16_bits* weight_copy = bf16_weight(weight);
  if (!p.widens()) return run_forward(p, y, x.bf16_data(), weight_copy, weight_copy, version);
  run_forward(p, y, widen(Scratch::kWideInput, x.bf16_data(), x.numel()),
              widened_weights(p, weight_copy), weight_copy, version);
}

void Conv2dOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(primitives_ != nullptr || cudnn_ != nullptr, "conv2d '", name,
           "': backward before forward");
  const Tensor& x = ws.values[inputs[0]];
  if (x.dtype() == DType::kBF16)
    FT_RUN_ON_CUDA(ws, conv2d_backward_bf16_cuda(
                           needs_input_grad ? ws.grads[inputs[0]].data() : nullptr,
                           params[this->params[0]].grad.data(), ws.grads[outputs[0]].data(),
                           x.bf16_data(), bf16_weight(params[this->params[0]]),
                           ws.grad_is_fresh(inputs[0]), cudnn_conv(), ws.stream));
  FT_RUN_ON_CUDA(
      ws, conv2d_backward_cuda(needs_input_grad ? ws.grads[inputs[0]].data() : nullptr,
                               params[this->params[0]].grad.data(), ws.grads[outputs[0]].data(),
                               x.data(), params[this->params[0]].value.data(),
                               ws.grad_is_fresh(inputs[0]), cudnn_conv(), ws.stream));
  FT_CHECK(primitives_ != nullptr, "conv2d '", name, "': backward before forward");
  Param& weight = params[this->params[0]];
  float* dx = needs_input_grad ? ws.grads[inputs[0]].data() : nullptr;
  const float* dy = ws.grads[outputs[0]].data();
  Primitives* p = alternative_ ? backward_choice_ : primitives_.get();
  if (p == nullptr) p = backward_choice_ = &measure_backward(dx != nullptr, weight, dy, x);
  backward_with(*p, dx, ws.grad_is_fresh(inputs[0]), weight.grad.data(), weight, dy, x);
}

void Conv2dOp::backward_with(Primitives& p, float* dx, bool dx_fresh, float* dweight,
                             const Param& weight, const float* dy, const Tensor& x) {
  if (x.dtype() == DType::kF32)
    return run_backward(p, dx, dx_fresh, dweight, dy, x.data(), weight.value.data());
  // bf16: dy is rounded to bf16 once, as the Linear's backward rounds it.
  const bf16_bits* weight_copy = bf16_weight(weight);
  const int64_t pixels = shape_numel(output_shape()) / out_channels_;
  if (!p.widens())
    return run_backward(p, dx, dx_fresh, dweight,
                        bf16_gradient_copy(dy, pixels, out_channels_, out_channels_), x.bf16_data(),
                        weight_copy);
  float* rounded_dy = thread_scratch(Scratch::kWideGradient, pixels * out_channels_);
  round_through_bf16(rounded_dy, dy, pixels * out_channels_);
  run_backward(p, dx, dx_fresh, dweight, rounded_dy,
               widen(Scratch::kWideInput, x.bf16_data(), x.numel()),
               widened_weights(p, weight_copy));
}

float* Conv2dOp::widened_weights(Primitives& p, const bf16_bits* weight_copy) {
  std::vector<float>& widened = p.widened_weights;
  widened.resize(shape_numel(weight_shape()));
  cast_to_float(widened.data(), weight_copy, static_cast<int64_t>(widened.size()));
  return widened.data();
}

OpCost Conv2dOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(batch_) * out_height_ * out_width_ * out_channels_ *
                      in_channels_ * kernel_ * kernel_;
  cost.forward_flops = 2 * macs;
  // Backward data and weight gradient each cost a forward; the stem skips backward data.
  cost.backward_flops = (needs_input_grad ? 4 : 2) * macs;
  // The weight as the kernels read it: its bf16 copy when x is bf16.
  cost.bytes_read +=
      graph.element_bytes(inputs[0]) * out_channels_ * in_channels_ * kernel_ * kernel_;
  return cost;
}

}  // namespace ft
