// Conv2dOp on oneDNN. Activations are nhwc on both sides of every primitive, so oneDNN reads and
// writes our buffers directly; only weights are reordered between our oihw and the primitive's
// blocked layout. Forward runs either as convolution_forward or, for stride-1 "same"
// convolutions, as the backward-data primitive of the flipped kernel. 3x3 "same" convolutions
// with 16k channels run all three passes on our Winograd kernels instead (see ConvAlgorithm).
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
#include "model/ops/conv2d.h"

#include <dnnl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/device.h"
#include "core/dnnl_context.h"
#include "model/ops/op_checks.h"
#include "model/ops/winograd.h"

namespace ft {
namespace {

using dnnl::memory;

// Plain oihw weights as one primitive wants them. When the layouts agree, `prim` is `user`.
struct StagedWeights {
  memory user;  // oihw; its handle is set at every call
  memory prim;
  dnnl::reorder reorder;  // user -> prim
  bool reordered = false;

  void to_prim(float* user_data) {
    user.set_data_handle(user_data);
    if (reordered) reorder.execute(cpu_stream(), user, prim);
  }
};

StagedWeights stage_weights(const memory::desc& user_md, const memory::desc& prim_md) {
  dnnl::engine& engine = cpu_engine();
  StagedWeights staged;
  staged.user = memory(user_md, engine, DNNL_MEMORY_NONE);
  if (prim_md == user_md) {
    staged.prim = staged.user;
    return staged;
  }
  staged.prim = memory(prim_md, engine);
  staged.reorder = dnnl::reorder(staged.user, staged.prim);
  staged.reordered = true;
  return staged;
}

// A per-thread buffer of at least `count` floats, reused by every op on this thread, aligned to
// a cache line like our tensors (oneDNN's 32-byte stores then never split a line).
float* thread_scratch(int64_t count) {
  constexpr size_t kAlign = 64;
  thread_local std::vector<float> scratch;
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  if (scratch.size() * sizeof(float) < bytes + kAlign)
    scratch.resize(count + kAlign / sizeof(float));
  void* start = scratch.data();
  size_t space = scratch.size() * sizeof(float);
  return static_cast<float*>(std::align(kAlign, bytes, start, space));
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

struct Conv2dOp::Primitives {
  ConvAlgorithm algorithm = ConvAlgorithm::kDirect;    // resolved
  std::vector<float> winograd_weights;                 // when kWinograd: transformed per pass
  dnnl::convolution_forward forward;                   // when kDirect
  dnnl::convolution_backward_data forward_transposed;  // when kTransposed
  std::vector<float> flipped_weights;                  // when kTransposed: flip_kernel's output
  StagedWeights forward_weights;                       // ours, or flipped_weights
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  StagedWeights data_weights;      // ours, for backward data
  memory src, dst, diff_dst;       // over our activation buffers; handles set at every call
  memory diff_src_written;         // over thread_scratch: backward data writes dx here
  memory diff_weights_written;     // op-owned, in the primitive's layout
  memory diff_weights_user;        // oihw over the parameter's gradient
  dnnl::reorder add_diff_weights;  // diff_weights_written -> diff_weights_user, with sum
  std::string forward_impl;
  // What the forward weights above were derived from; backward invalidates them (Winograd's
  // backward data reuses winograd_weights).
  bool forward_weights_valid = false;
  uint64_t forward_weights_version = 0;
  const float* forward_weights_source = nullptr;
};

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

ConvAlgorithm Conv2dOp::resolved_algorithm() const {
  const bool nhwc = input_layout == ActivationLayout::kNhwc;
  const bool same = stride_ == 1 && 2 * padding_ == kernel_ - 1;
  const bool transposed_applies = same && in_channels_ >= 8 && nhwc;
  const bool winograd_applies =
      same && kernel_ == 3 && nhwc && winograd_supports(in_channels_, out_channels_);
  switch (algorithm) {
    case ConvAlgorithm::kAuto:
      if (winograd_applies) return ConvAlgorithm::kWinograd;
      [[fallthrough]];
    case ConvAlgorithm::kOneDnn:
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
      FT_CHECK(winograd_applies, "conv2d '", name, "': Winograd needs a 3x3 kernel, stride 1, ",
               "padding 1, NHWC input and channels that are multiples of 16; got kernel ", kernel_,
               ", stride ", stride_, ", padding ", padding_, ", ", in_channels_, " -> ",
               out_channels_, " channels");
      return ConvAlgorithm::kWinograd;
  }
  FT_FAIL("conv2d '", name, "': unknown algorithm");
}

const char* Conv2dOp::forward_impl() const {
  return primitives_ ? primitives_->forward_impl.c_str() : "";
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

void Conv2dOp::build_primitives() {
  if (resolved_algorithm() == ConvAlgorithm::kWinograd) {
    auto p = std::make_unique<Primitives>();
    p->algorithm = ConvAlgorithm::kWinograd;
    p->winograd_weights.resize(winograd_weights_numel(in_channels_, out_channels_, winograd_tile));
    p->forward_impl =
        winograd_tile == WinogradTile::k2x2 ? "winograd:f2x2_3x3" : "winograd:f4x4_3x3";
    primitives_ = std::move(p);
    return;
  }
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  dnnl::engine& engine = cpu_engine();
  // oneDNN's dims are always in NCHW order; the format tag says how memory is laid out. With one
  // channel nchw and nhwc are the same bytes, and nhwc lets oneDNN pick the same kernel as for
  // every other convolution.
  const bool src_nchw = input_layout == ActivationLayout::kNchw && in_channels_ > 1;
  const memory::desc src_md({batch_, in_channels_, height_, width_}, f32,
                            src_nchw ? tag::nchw : tag::nhwc);
  const memory::desc dst_md({batch_, out_channels_, out_height_, out_width_}, f32, tag::nhwc);
  const memory::dims weights_dims{out_channels_, in_channels_, kernel_, kernel_};
  const memory::desc weights_md(weights_dims, f32, tag::oihw);
  const memory::desc any_weights_md(weights_dims, f32, tag::any);
  const memory::dims strides{stride_, stride_};
  // PyTorch floors the output size; oneDNN's size check floors too, so padding_r = padding_l.
  const memory::dims padding{padding_, padding_};
  using dnnl::algorithm;

  const dnnl::convolution_forward::primitive_desc forward_pd(
      {dnnl::prop_kind::forward_training, algorithm::convolution_direct, src_md, any_weights_md,
       dst_md, strides, padding, padding},
      engine);
  const dnnl::convolution_backward_data::primitive_desc backward_data_pd(
      {algorithm::convolution_direct, src_md, any_weights_md, dst_md, strides, padding, padding},
      engine, forward_pd);
  // oneDNN 2.6's jit_1x1 backward weights corrupts the heap on nhwc with stride > 1 and fewer
  // than 8 input channels (seen at 2..7; 9..36 were fine). Plain hwio weights rule that kernel
  // out (gemm runs instead); only tiny test models have such a layer.
  const bool avoid_1x1_kernel = kernel_ == 1 && stride_ > 1 && in_channels_ % 8 != 0;
  const dnnl::convolution_backward_weights::primitive_desc backward_weights_pd(
      {algorithm::convolution_direct, src_md,
       avoid_1x1_kernel ? memory::desc(weights_dims, f32, tag::hwio) : any_weights_md, dst_md,
       strides, padding, padding},
      engine, forward_pd);
  // Activation descriptors were fixed above, so every primitive uses our buffers as they are.
  FT_CHECK(forward_pd.src_desc() == src_md && forward_pd.dst_desc() == dst_md &&
               backward_data_pd.diff_src_desc() == src_md &&
               backward_data_pd.diff_dst_desc() == dst_md &&
               backward_weights_pd.src_desc() == src_md &&
               backward_weights_pd.diff_dst_desc() == dst_md,
           "conv2d '", name, "': oneDNN changed an activation layout");

  auto p = std::make_unique<Primitives>();
  p->algorithm = resolved_algorithm();
  if (p->algorithm == ConvAlgorithm::kTransposed) {
    // The transposed convolution maps out_channels to in_channels; its backward data reads our
    // x as its diff_dst and writes our y as its diff_src (same spatial size at stride 1).
    const memory::dims flipped_dims{in_channels_, out_channels_, kernel_, kernel_};
    const memory::desc any_flipped_md(flipped_dims, f32, tag::any);
    const dnnl::convolution_forward::primitive_desc transposed_hint(
        {dnnl::prop_kind::forward_training, algorithm::convolution_direct, dst_md, any_flipped_md,
         src_md, strides, padding, padding},
        engine);
    const dnnl::convolution_backward_data::primitive_desc transposed_pd(
        {algorithm::convolution_direct, dst_md, any_flipped_md, src_md, strides, padding, padding},
        engine, transposed_hint);
    FT_CHECK(transposed_pd.diff_src_desc() == dst_md && transposed_pd.diff_dst_desc() == src_md,
             "conv2d '", name, "': oneDNN changed an activation layout");
    p->forward_transposed = dnnl::convolution_backward_data(transposed_pd);
    p->flipped_weights.resize(shape_numel(weight_shape()));
    p->forward_weights =
        stage_weights(memory::desc(flipped_dims, f32, tag::oihw), transposed_pd.weights_desc());
    p->forward_impl = transposed_pd.impl_info_str();
  } else {
    p->forward = dnnl::convolution_forward(forward_pd);
    p->forward_weights = stage_weights(weights_md, forward_pd.weights_desc());
    p->forward_impl = forward_pd.impl_info_str();
  }
  p->backward_data = dnnl::convolution_backward_data(backward_data_pd);
  p->backward_weights = dnnl::convolution_backward_weights(backward_weights_pd);
  p->data_weights = stage_weights(weights_md, backward_data_pd.weights_desc());
  p->src = memory(src_md, engine, DNNL_MEMORY_NONE);
  p->dst = memory(dst_md, engine, DNNL_MEMORY_NONE);
  p->diff_dst = memory(dst_md, engine, DNNL_MEMORY_NONE);
  p->diff_src_written = memory(src_md, engine, DNNL_MEMORY_NONE);
  p->diff_weights_written = memory(backward_weights_pd.diff_weights_desc(), engine);
  p->diff_weights_user = memory(weights_md, engine, DNNL_MEMORY_NONE);
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(sum);
  p->add_diff_weights = dnnl::reorder(dnnl::reorder::primitive_desc(
      engine, backward_weights_pd.diff_weights_desc(), engine, weights_md, attr));
  primitives_ = std::move(p);
}

void Conv2dOp::forward(Workspace& ws, ParamStore& params) {
  expect_arity(*this, 1, 1, 1);
  Tensor& x = ws.values[inputs[0]];
  Tensor& y = ws.values[outputs[0]];
  Tensor& weight = params[this->params[0]].value;
  expect_numel(x, shape_numel(input_shape()), *this, "x");
  expect_numel(y, shape_numel(output_shape()), *this, "y");
  expect_numel(weight, shape_numel(weight_shape()), *this, "weight");
  FT_RUN_ON_CUDA(ws,
                 conv2d_forward_cuda(y.data(), x.data(), weight.data(), cudnn_conv(), ws.stream));
  if (!primitives_) build_primitives();
  Primitives& p = *primitives_;
  // The forward weights (transformed, flipped or reordered) are redone only when the parameters
  // may have changed: every train forward (ParamStore::version moves), but an eval graph between
  // optimizer steps reuses them, as an inference engine prepacks its weights.
  const bool weights_current = p.forward_weights_valid &&
                               p.forward_weights_version == params.version() &&
                               p.forward_weights_source == weight.data();
  p.forward_weights_valid = true;
  p.forward_weights_version = params.version();
  p.forward_weights_source = weight.data();
  if (p.algorithm == ConvAlgorithm::kWinograd) {
    if (!weights_current)
      winograd_transform_weights(p.winograd_weights.data(), weight.data(), out_channels_,
                                 in_channels_, winograd_tile, WinogradPass::kForward);
    winograd_conv(y.data(), x.data(), p.winograd_weights.data(), winograd_shape(),
                  WinogradWrite::kOverwrite);
    return;
  }
  p.src.set_data_handle(x.data());
  p.dst.set_data_handle(y.data());
  if (p.algorithm == ConvAlgorithm::kTransposed) {
    if (!weights_current) {
      flip_kernel(p.flipped_weights.data(), weight.data(), out_channels_, in_channels_, kernel_);
      p.forward_weights.to_prim(p.flipped_weights.data());
    }
    p.forward_transposed.execute(cpu_stream(), {{DNNL_ARG_DIFF_DST, p.src},
                                                {DNNL_ARG_WEIGHTS, p.forward_weights.prim},
                                                {DNNL_ARG_DIFF_SRC, p.dst}});
  } else {
    if (!weights_current) p.forward_weights.to_prim(weight.data());
    p.forward.execute(
        cpu_stream(),
        {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_WEIGHTS, p.forward_weights.prim}, {DNNL_ARG_DST, p.dst}});
  }
  cpu_stream().wait();
}

void Conv2dOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(primitives_ != nullptr || cudnn_ != nullptr, "conv2d '", name,
           "': backward before forward");
  FT_RUN_ON_CUDA(
      ws, conv2d_backward_cuda(needs_input_grad ? ws.grads[inputs[0]].data() : nullptr,
                               params[this->params[0]].grad.data(), ws.grads[outputs[0]].data(),
                               ws.values[inputs[0]].data(), params[this->params[0]].value.data(),
                               ws.grad_is_fresh(inputs[0]), cudnn_conv(), ws.stream));
  FT_CHECK(primitives_ != nullptr, "conv2d '", name, "': backward before forward");
  Primitives& p = *primitives_;
  p.forward_weights_valid = false;
  Param& weight = params[this->params[0]];
  if (p.algorithm == ConvAlgorithm::kWinograd) {
    const float* x = ws.values[inputs[0]].data();
    const float* dy = ws.grads[outputs[0]].data();
    winograd_conv_weight_grad(weight.grad.data(), x, dy, winograd_shape());
    if (!needs_input_grad) return;
    // dx is the forward of the transposed problem: dy's Cout channels in, Cin out.
    winograd_transform_weights(p.winograd_weights.data(), weight.value.data(), out_channels_,
                               in_channels_, winograd_tile, WinogradPass::kBackwardData);
    winograd_conv(
        ws.grads[inputs[0]].data(), dy, p.winograd_weights.data(),
        {batch_, height_, width_, out_channels_, in_channels_, winograd_tile},
        ws.grad_is_fresh(inputs[0]) ? WinogradWrite::kOverwrite : WinogradWrite::kAccumulate);
    return;
  }
  p.src.set_data_handle(ws.values[inputs[0]].data());
  p.diff_dst.set_data_handle(ws.grads[outputs[0]].data());

  // dw: correlate x with dy.
  p.backward_weights.execute(cpu_stream(), {{DNNL_ARG_SRC, p.src},
                                            {DNNL_ARG_DIFF_DST, p.diff_dst},
                                            {DNNL_ARG_DIFF_WEIGHTS, p.diff_weights_written}});
  p.diff_weights_user.set_data_handle(weight.grad.data());
  p.add_diff_weights.execute(cpu_stream(), p.diff_weights_written, p.diff_weights_user);

  if (needs_input_grad) {
    // dx: transposed convolution of dy with w, straight into a fresh gradient.
    const int64_t count = shape_numel(input_shape());
    const bool fresh = ws.grad_is_fresh(inputs[0]);
    float* written = fresh ? ws.grads[inputs[0]].data() : thread_scratch(count);
    p.diff_src_written.set_data_handle(written);
    p.data_weights.to_prim(weight.value.data());
    p.backward_data.execute(cpu_stream(), {{DNNL_ARG_DIFF_SRC, p.diff_src_written},
                                           {DNNL_ARG_WEIGHTS, p.data_weights.prim},
                                           {DNNL_ARG_DIFF_DST, p.diff_dst}});
    cpu_stream().wait();
    if (!fresh) add_into(ws.grads[inputs[0]].data(), written, count);
  }
  cpu_stream().wait();
}

OpCost Conv2dOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(batch_) * out_height_ * out_width_ * out_channels_ *
                      in_channels_ * kernel_ * kernel_;
  cost.forward_flops = 2 * macs;
  // Backward data and weight gradient each cost a forward; the stem skips backward data.
  cost.backward_flops = (needs_input_grad ? 4 : 2) * macs;
  cost.bytes_read += 4.0 * out_channels_ * in_channels_ * kernel_ * kernel_;
  return cost;
}

}  // namespace ft
