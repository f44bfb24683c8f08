// Conv2dOp on oneDNN with plain nchw/oihw layouts, so our activation and parameter buffers are
// handed to the primitives directly (no reorders).
//
// Backward, with dy = dL/dy:
//   dx[b,c,h,w]   += sum_{o,p,q : h = i*S+p-P, w = j*S+q-P} w[o,c,p,q] * dy[b,o,i,j]
//                    (a transposed convolution of dy; convolution_backward_data)
//   dw[o,c,p,q]   += sum_{b,i,j} dy[b,o,i,j] * x[b, c, i*S+p-P, j*S+q-P]
//                    (a correlation of x with dy; convolution_backward_weights)
// oneDNN writes (=) both results, so each goes into a scratch buffer and is then added: dx may
// already hold the shortcut path's gradient, and dw the gradient of an earlier micro-batch.
#include "model/ops/conv2d.h"

#include <dnnl.hpp>

#include "core/check.h"
#include "core/dnnl_context.h"
#include "model/ops/op_checks.h"

namespace ft {

struct Conv2dOp::Primitives {
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  // Memory objects without storage; each call points them at the current buffers.
  dnnl::memory src, weights, dst;
};

namespace {

// dst += src, elementwise.
void add_into(float* dst, const float* src, int64_t count) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] += src[i];
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
  FT_CHECK(height + 2 * padding >= kernel && width + 2 * padding >= kernel,
           "conv2d: kernel ", kernel, " larger than the padded input ", height, "x", width,
           " (padding ", padding, ")");
  out_height_ = (height + 2 * padding - kernel) / stride + 1;
  out_width_ = (width + 2 * padding - kernel) / stride + 1;
}

Conv2dOp::~Conv2dOp() = default;

void Conv2dOp::build_primitives() {
  using dnnl::memory;
  using tag = memory::format_tag;
  dnnl::engine& engine = cpu_engine();
  const memory::desc src_md({batch_, in_channels_, height_, width_}, memory::data_type::f32,
                            tag::nchw);
  const memory::desc weights_md({out_channels_, in_channels_, kernel_, kernel_},
                                memory::data_type::f32, tag::oihw);
  const memory::desc dst_md({batch_, out_channels_, out_height_, out_width_},
                            memory::data_type::f32, tag::nchw);
  const memory::dims strides{stride_, stride_};
  // PyTorch floors the output size; oneDNN's size check floors too, so padding_r = padding_l.
  const memory::dims padding{padding_, padding_};

  dnnl::convolution_forward::desc forward_desc(
      dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_md, weights_md,
      dst_md, strides, padding, padding);
  dnnl::convolution_forward::primitive_desc forward_pd(forward_desc, engine);
  dnnl::convolution_backward_data::desc backward_data_desc(
      dnnl::algorithm::convolution_direct, src_md, weights_md, dst_md, strides, padding, padding);
  dnnl::convolution_backward_data::primitive_desc backward_data_pd(backward_data_desc, engine,
                                                                   forward_pd);
  dnnl::convolution_backward_weights::desc backward_weights_desc(
      dnnl::algorithm::convolution_direct, src_md, weights_md, dst_md, strides, padding, padding);
  dnnl::convolution_backward_weights::primitive_desc backward_weights_pd(backward_weights_desc,
                                                                         engine, forward_pd);
  // Plain layouts were requested, so oneDNN must not have substituted blocked ones.
  FT_CHECK(forward_pd.src_desc() == src_md && forward_pd.weights_desc() == weights_md &&
               forward_pd.dst_desc() == dst_md,
           "conv2d: oneDNN chose a non-plain layout");

  auto primitives = std::make_unique<Primitives>();
  primitives->forward = dnnl::convolution_forward(forward_pd);
  primitives->backward_data = dnnl::convolution_backward_data(backward_data_pd);
  primitives->backward_weights = dnnl::convolution_backward_weights(backward_weights_pd);
  primitives->src = memory(src_md, engine, DNNL_MEMORY_NONE);
  primitives->weights = memory(weights_md, engine, DNNL_MEMORY_NONE);
  primitives->dst = memory(dst_md, engine, DNNL_MEMORY_NONE);
  primitives_ = std::move(primitives);
  dx_scratch_ = Tensor::empty(input_shape());
  dw_scratch_ = Tensor::empty(weight_shape());
}

void Conv2dOp::forward(Workspace& ws, ParamStore& params) {
  expect_arity(*this, 1, 1, 1);
  Tensor& x = ws.values[inputs[0]];
  Tensor& y = ws.values[outputs[0]];
  Tensor& weight = params[this->params[0]].value;
  expect_numel(x, shape_numel(input_shape()), *this, "x");
  expect_numel(y, shape_numel(output_shape()), *this, "y");
  expect_numel(weight, shape_numel(weight_shape()), *this, "weight");
  if (!primitives_) build_primitives();
  Primitives& p = *primitives_;
  p.src.set_data_handle(x.data());
  p.weights.set_data_handle(weight.data());
  p.dst.set_data_handle(y.data());
  p.forward.execute(cpu_stream(), {{DNNL_ARG_SRC, p.src},
                                   {DNNL_ARG_WEIGHTS, p.weights},
                                   {DNNL_ARG_DST, p.dst}});
  cpu_stream().wait();
}

void Conv2dOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(primitives_ != nullptr, "conv2d '", name, "': backward before forward");
  Primitives& p = *primitives_;
  Param& weight = params[this->params[0]];
  Tensor& dy = ws.grads[outputs[0]];
  p.dst.set_data_handle(dy.data());

  // dw: correlate x with dy.
  p.src.set_data_handle(ws.values[inputs[0]].data());
  p.weights.set_data_handle(dw_scratch_.data());
  p.backward_weights.execute(cpu_stream(), {{DNNL_ARG_SRC, p.src},
                                            {DNNL_ARG_DIFF_DST, p.dst},
                                            {DNNL_ARG_DIFF_WEIGHTS, p.weights}});
  cpu_stream().wait();
  add_into(weight.grad.data(), dw_scratch_.data(), dw_scratch_.numel());

  if (!needs_input_grad) return;
  // dx: transposed convolution of dy with w.
  p.src.set_data_handle(dx_scratch_.data());
  p.weights.set_data_handle(weight.value.data());
  p.backward_data.execute(cpu_stream(), {{DNNL_ARG_DIFF_SRC, p.src},
                                         {DNNL_ARG_WEIGHTS, p.weights},
                                         {DNNL_ARG_DIFF_DST, p.dst}});
  cpu_stream().wait();
  add_into(ws.grads[inputs[0]].data(), dx_scratch_.data(), dx_scratch_.numel());
}

}  // namespace ft
