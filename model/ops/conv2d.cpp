// Conv2dOp on oneDNN. Our buffers are plain nchw/oihw; each primitive either uses them directly
// (plain layout) or works on blocked copies, reordered in and out (see ConvLayout in conv2d.h).
//
// Backward, with dy = dL/dy:
//   dx[b,c,h,w]   += sum_{o,p,q : h = i*S+p-P, w = j*S+q-P} w[o,c,p,q] * dy[b,o,i,j]
//                    (a transposed convolution of dy; convolution_backward_data)
//   dw[o,c,p,q]   += sum_{b,i,j} dy[b,o,i,j] * x[b, c, i*S+p-P, j*S+q-P]
//                    (a correlation of x with dy; convolution_backward_weights)
// oneDNN writes (=) both results and backward primitives take no sum post-op, so each goes into an
// op-owned buffer and a reorder with a sum post-op adds it into ours: dx may already hold the
// shortcut's gradient, and dw the gradient of an earlier micro-batch.
#include "model/ops/conv2d.h"

#include <dnnl.hpp>

#include "core/check.h"
#include "core/dnnl_context.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

using dnnl::memory;

// One tensor as a primitive wants it, beside our plain buffer. When the layouts agree, `prim` is
// the same memory as `user` and no reorder runs.
struct Staged {
  memory user;  // plain layout over our buffer; its handle is set at every call
  memory prim;  // the primitive's layout
  dnnl::reorder reorder;  // user -> prim for inputs, prim -> user for outputs
  bool reordered = false;

  void to_prim() {
    if (reordered) reorder.execute(cpu_stream(), user, prim);
  }
  void from_prim() {
    if (reordered) reorder.execute(cpu_stream(), prim, user);
  }
};

// An input read by a primitive, or an output written (=) into ours.
Staged stage(const memory::desc& user_md, const memory::desc& prim_md, bool is_input) {
  dnnl::engine& engine = cpu_engine();
  Staged staged;
  staged.user = memory(user_md, engine, DNNL_MEMORY_NONE);
  if (prim_md == user_md) {
    staged.prim = staged.user;
    return staged;
  }
  staged.prim = memory(prim_md, engine);
  staged.reorder = is_input ? dnnl::reorder(staged.user, staged.prim)
                            : dnnl::reorder(staged.prim, staged.user);
  staged.reordered = true;
  return staged;
}

// A second reader of the same buffer: when the layouts agree it shares `first`'s copy, which
// `first.to_prim()` has filled earlier in the same pass (or in forward, for x and w); otherwise
// it gets its own reorder.
Staged stage_again(const Staged& first, const memory::desc& user_md, const memory::desc& prim_md) {
  if (first.prim.get_desc() != prim_md) return stage(user_md, prim_md, /*is_input=*/true);
  Staged shared = first;
  shared.reordered = false;
  return shared;
}

// A gradient the primitive writes (=) into its own buffer and a reorder adds (+=) into ours.
Staged stage_accumulated(const memory::desc& user_md, const memory::desc& prim_md) {
  dnnl::engine& engine = cpu_engine();
  Staged staged;
  staged.user = memory(user_md, engine, DNNL_MEMORY_NONE);
  staged.prim = memory(prim_md, engine);
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(sum);
  staged.reorder =
      dnnl::reorder(dnnl::reorder::primitive_desc(engine, prim_md, engine, user_md, attr));
  staged.reordered = true;
  return staged;
}

}  // namespace

struct Conv2dOp::Primitives {
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  Staged src, weights, dst;                                    // forward
  Staged diff_dst, weights_for_data, diff_src;                 // backward data
  Staged src_for_weights, diff_dst_for_weights, diff_weights;  // backward weights
  bool blocked = false;
};

namespace {

// The three primitive descriptors for one layout choice; `any` lets oneDNN pick layouts.
struct ConvDescs {
  dnnl::convolution_forward::primitive_desc forward;
  dnnl::convolution_backward_data::primitive_desc backward_data;
  dnnl::convolution_backward_weights::primitive_desc backward_weights;
};

ConvDescs make_descs(const memory::desc& src_md, const memory::desc& weights_md,
                     const memory::desc& dst_md, const memory::dims& strides,
                     const memory::dims& padding) {
  dnnl::engine& engine = cpu_engine();
  ConvDescs descs;
  descs.forward = dnnl::convolution_forward::primitive_desc(
      {dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_md, weights_md,
       dst_md, strides, padding, padding},
      engine);
  descs.backward_data = dnnl::convolution_backward_data::primitive_desc(
      {dnnl::algorithm::convolution_direct, src_md, weights_md, dst_md, strides, padding, padding},
      engine, descs.forward);
  descs.backward_weights = dnnl::convolution_backward_weights::primitive_desc(
      {dnnl::algorithm::convolution_direct, src_md, weights_md, dst_md, strides, padding, padding},
      engine, descs.forward);
  return descs;
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

bool Conv2dOp::uses_blocked_layout() const { return primitives_ && primitives_->blocked; }

void Conv2dOp::build_primitives() {
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  const memory::dims src_dims{batch_, in_channels_, height_, width_};
  const memory::dims weights_dims{out_channels_, in_channels_, kernel_, kernel_};
  const memory::dims dst_dims{batch_, out_channels_, out_height_, out_width_};
  const memory::desc src_md(src_dims, f32, tag::nchw);
  const memory::desc weights_md(weights_dims, f32, tag::oihw);
  const memory::desc dst_md(dst_dims, f32, tag::nchw);
  const memory::dims strides{stride_, stride_};
  // PyTorch floors the output size; oneDNN's size check floors too, so padding_r = padding_l.
  const memory::dims padding{padding_, padding_};

  const bool blocked =
      layout == ConvLayout::kBlocked ||
      (layout == ConvLayout::kAuto && kernel_ > 1 && in_channels_ >= 16);
  const ConvDescs descs =
      blocked ? make_descs(memory::desc(src_dims, f32, tag::any),
                           memory::desc(weights_dims, f32, tag::any),
                           memory::desc(dst_dims, f32, tag::any), strides, padding)
              : make_descs(src_md, weights_md, dst_md, strides, padding);

  auto p = std::make_unique<Primitives>();
  p->forward = dnnl::convolution_forward(descs.forward);
  p->backward_data = dnnl::convolution_backward_data(descs.backward_data);
  p->backward_weights = dnnl::convolution_backward_weights(descs.backward_weights);
  p->src = stage(src_md, descs.forward.src_desc(), /*is_input=*/true);
  p->weights = stage(weights_md, descs.forward.weights_desc(), /*is_input=*/true);
  p->dst = stage(dst_md, descs.forward.dst_desc(), /*is_input=*/false);
  p->diff_dst = stage(dst_md, descs.backward_data.diff_dst_desc(), /*is_input=*/true);
  // On AVX2, backward data wants OIhw8o8i weights where forward took OIhw8i8o: a small reorder.
  p->weights_for_data = stage_again(p->weights, weights_md, descs.backward_data.weights_desc());
  p->diff_src = stage_accumulated(src_md, descs.backward_data.diff_src_desc());
  p->src_for_weights = stage_again(p->src, src_md, descs.backward_weights.src_desc());
  p->diff_dst_for_weights =
      stage_again(p->diff_dst, dst_md, descs.backward_weights.diff_dst_desc());
  p->diff_weights = stage_accumulated(weights_md, descs.backward_weights.diff_weights_desc());
  p->blocked = p->src.reordered || p->weights.reordered || p->dst.reordered;
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
  if (!primitives_) build_primitives();
  Primitives& p = *primitives_;
  p.src.user.set_data_handle(x.data());
  p.weights.user.set_data_handle(weight.data());
  p.dst.user.set_data_handle(y.data());
  p.src.to_prim();
  p.weights.to_prim();
  p.forward.execute(cpu_stream(), {{DNNL_ARG_SRC, p.src.prim},
                                   {DNNL_ARG_WEIGHTS, p.weights.prim},
                                   {DNNL_ARG_DST, p.dst.prim}});
  p.dst.from_prim();
  cpu_stream().wait();
}

void Conv2dOp::backward(Workspace& ws, ParamStore& params) {
  FT_CHECK(primitives_ != nullptr, "conv2d '", name, "': backward before forward");
  Primitives& p = *primitives_;
  Param& weight = params[this->params[0]];
  float* x = ws.values[inputs[0]].data();
  float* dy = ws.grads[outputs[0]].data();
  // Copies shared with forward still hold its x and w; every plain view needs its handle.
  for (Staged* staged : {&p.src, &p.src_for_weights}) staged->user.set_data_handle(x);
  for (Staged* staged : {&p.weights, &p.weights_for_data})
    staged->user.set_data_handle(weight.value.data());
  for (Staged* staged : {&p.diff_dst, &p.diff_dst_for_weights}) staged->user.set_data_handle(dy);
  p.diff_dst.to_prim();

  // dw: correlate x with dy.
  p.src_for_weights.to_prim();
  p.diff_dst_for_weights.to_prim();
  p.backward_weights.execute(cpu_stream(), {{DNNL_ARG_SRC, p.src_for_weights.prim},
                                            {DNNL_ARG_DIFF_DST, p.diff_dst_for_weights.prim},
                                            {DNNL_ARG_DIFF_WEIGHTS, p.diff_weights.prim}});
  p.diff_weights.user.set_data_handle(weight.grad.data());
  p.diff_weights.from_prim();

  if (needs_input_grad) {
    // dx: transposed convolution of dy with w.
    p.weights_for_data.to_prim();
    p.backward_data.execute(cpu_stream(), {{DNNL_ARG_DIFF_SRC, p.diff_src.prim},
                                           {DNNL_ARG_WEIGHTS, p.weights_for_data.prim},
                                           {DNNL_ARG_DIFF_DST, p.diff_dst.prim}});
    p.diff_src.user.set_data_handle(ws.grads[inputs[0]].data());
    p.diff_src.from_prim();
  }
  cpu_stream().wait();
}

}  // namespace ft
