// Building Conv2dOp's primitives (see conv2d_primitives.h). Activations are nhwc on both sides of
// every primitive, so oneDNN reads and writes our buffers directly; only weights are reordered
// between our oihw and the primitive's blocked layout.
// A bf16 input takes oneDNN's bf16 direct kernels where the CPU has bf16 instructions
// (bf16_gemm_native(), the GEMMs' test); oneDNN 2.6 refuses bf16 convolutions on AVX2 and
// emulates them slowly on AVX-512 without BF16, so elsewhere, and for any shape where oneDNN
// offers only its reference kernels, the operands are widened and the fp32 primitives run on the
// same bf16-rounded values.
#include "model/ops/conv2d_primitives.h"

#include <dnnl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dnnl_context.h"
#include "core/gemm.h"
#include "model/ops/conv2d.h"
#include "model/ops/winograd.h"

namespace ft {
namespace conv2d_detail {

void StagedWeights::to_prim(const void* user_data) {
  user.set_data_handle(const_cast<void*>(user_data));
  if (reordered) reorder.execute(cpu_stream(), user, prim);
}

StagedWeights stage_weights(const dnnl::memory::desc& user_md, const dnnl::memory::desc& prim_md) {
  dnnl::engine& engine = cpu_engine();
  StagedWeights staged;
  staged.user = dnnl::memory(user_md, engine, DNNL_MEMORY_NONE);
  if (prim_md == user_md) {
    staged.prim = staged.user;
    return staged;
  }
  staged.prim = dnnl::memory(prim_md, engine);
  staged.reorder = dnnl::reorder(staged.user, staged.prim);
  staged.reordered = true;
  return staged;
}

float* thread_scratch(Scratch slot, int64_t count) {
  constexpr size_t kAlign = 64;
  thread_local std::vector<float> scratch[3];
  std::vector<float>& buffer = scratch[static_cast<int>(slot)];
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  if (buffer.size() * sizeof(float) < bytes + kAlign) buffer.resize(count + kAlign / sizeof(float));
  void* start = buffer.data();
  size_t space = buffer.size() * sizeof(float);
  return static_cast<float*>(std::align(kAlign, bytes, start, space));
}

namespace {

bool is_reference(const std::string& impl) {
  return impl.rfind("ref", 0) == 0;
}

}  // namespace
}  // namespace conv2d_detail

using conv2d_detail::stage_weights;
using dnnl::memory;

void Conv2dOp::build_primitives(DType input) {
  alternative_ = make_measured_alternative(input);
  if (input == DType::kBF16 && bf16_gemm_native()) {
    primitives_ = make_onednn_primitives(ConvAlgorithm::kDirect, DType::kBF16);
    if (primitives_) {
      primitives_->input = input;
      return;
    }
  }
  // fp32 primitives; for a bf16 input they run on its widened values (Primitives::widens).
  const ConvAlgorithm algorithm = resolved_algorithm();
  if (algorithm == ConvAlgorithm::kWinograd) {
    primitives_ = make_winograd_primitives(input);
    return;
  }
  primitives_ = make_onednn_primitives(algorithm, DType::kF32);
  FT_CHECK(primitives_ != nullptr, "conv2d '", name, "': oneDNN has no fp32 convolution here");
  primitives_->input = input;
  if (input == DType::kBF16) primitives_->forward_impl = "widened:" + primitives_->forward_impl;
}

std::unique_ptr<Conv2dOp::Primitives> Conv2dOp::make_winograd_primitives(DType input) const {
  auto p = std::make_unique<Primitives>();
  p->algorithm = ConvAlgorithm::kWinograd;
  p->input = input;
  p->winograd_weights.resize(winograd_weights_numel(in_channels_, out_channels_, winograd_tile));
  p->forward_impl = winograd_tile == WinogradTile::k2x2 ? "winograd:f2x2_3x3" : "winograd:f4x4_3x3";
  if (input == DType::kBF16) p->forward_impl = "widened:" + p->forward_impl;
  return p;
}

std::unique_ptr<Conv2dOp::Primitives> Conv2dOp::make_measured_alternative(DType input) const {
  if (algorithm != ConvAlgorithm::kMeasure || !winograd_applies()) return nullptr;
  return make_winograd_primitives(input);
}

std::unique_ptr<Conv2dOp::Primitives> Conv2dOp::make_onednn_primitives(ConvAlgorithm conv_algorithm,
                                                                       DType operands) const {
  using tag = memory::format_tag;
  const auto f32 = memory::data_type::f32;
  const auto operand_type = operands == DType::kBF16 ? memory::data_type::bf16 : f32;
  dnnl::engine& engine = cpu_engine();
  // oneDNN's dims are always in NCHW order; the format tag says how memory is laid out. With one
  // channel nchw and nhwc are the same bytes, and nhwc lets oneDNN pick the same kernel as for
  // every other convolution.
  const bool src_nchw = input_layout == ActivationLayout::kNchw && in_channels_ > 1;
  const memory::dims src_dims{batch_, in_channels_, height_, width_};
  const memory::dims dst_dims{batch_, out_channels_, out_height_, out_width_};
  const tag src_tag = src_nchw ? tag::nchw : tag::nhwc;
  // What the primitives read in the operands' type; what they write (and the weights' gradient)
  // in fp32.
  const memory::desc src_md(src_dims, operand_type, src_tag);
  const memory::desc diff_dst_md(dst_dims, operand_type, tag::nhwc);
  const memory::desc diff_src_md(src_dims, f32, src_tag);
  const memory::desc dst_md(dst_dims, f32, tag::nhwc);
  const memory::dims weights_dims{out_channels_, in_channels_, kernel_, kernel_};
  const memory::desc weights_md(weights_dims, operand_type, tag::oihw);
  const memory::desc any_weights_md(weights_dims, operand_type, tag::any);
  const memory::desc diff_weights_md(weights_dims, f32, tag::oihw);
  const memory::dims strides{stride_, stride_};
  // PyTorch floors the output size; oneDNN's size check floors too, so padding_r = padding_l.
  const memory::dims padding{padding_, padding_};
  using dnnl::algorithm;

  // oneDNN 2.6's jit_1x1 backward weights corrupts the heap on nhwc with stride > 1 and fewer
  // than 8 input channels (seen at 2..7; 9..36 were fine). Plain hwio weights rule that kernel
  // out (gemm runs instead); only tiny test models have such a layer.
  const bool avoid_1x1_kernel = kernel_ == 1 && stride_ > 1 && in_channels_ % 8 != 0;
  dnnl::convolution_forward::primitive_desc forward_pd;
  dnnl::convolution_backward_data::primitive_desc backward_data_pd;
  dnnl::convolution_backward_weights::primitive_desc backward_weights_pd;
  try {
    forward_pd = dnnl::convolution_forward::primitive_desc(
        {dnnl::prop_kind::forward_training, algorithm::convolution_direct, src_md, any_weights_md,
         dst_md, strides, padding, padding},
        engine);
    backward_data_pd = dnnl::convolution_backward_data::primitive_desc(
        {algorithm::convolution_direct, diff_src_md, any_weights_md, diff_dst_md, strides, padding,
         padding},
        engine, forward_pd);
    backward_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
        {algorithm::convolution_direct, src_md,
         memory::desc(weights_dims, f32, avoid_1x1_kernel ? tag::hwio : tag::any), diff_dst_md,
         strides, padding, padding},
        engine, forward_pd);
  } catch (const dnnl::error&) {
    if (operands == DType::kBF16) return nullptr;  // no bf16 kernel for this shape: widen
    throw;
  }
  // oneDNN's reference kernels are orders slower than widening and running fp32's jit kernels.
  if (operands == DType::kBF16 &&
      (conv2d_detail::is_reference(forward_pd.impl_info_str()) ||
       conv2d_detail::is_reference(backward_weights_pd.impl_info_str()) ||
       (needs_input_grad && conv2d_detail::is_reference(backward_data_pd.impl_info_str()))))
    return nullptr;
  // Activation descriptors were fixed above, so every primitive uses our buffers as they are.
  FT_CHECK(forward_pd.src_desc() == src_md && forward_pd.dst_desc() == dst_md &&
               backward_data_pd.diff_src_desc() == diff_src_md &&
               backward_data_pd.diff_dst_desc() == diff_dst_md &&
               backward_weights_pd.src_desc() == src_md &&
               backward_weights_pd.diff_dst_desc() == diff_dst_md,
           "conv2d '", name, "': oneDNN changed an activation layout");

  auto p = std::make_unique<Primitives>();
  p->algorithm = conv_algorithm;
  p->operands = operands;
  if (p->algorithm == ConvAlgorithm::kTransposed) {
    // fp32 only. The transposed convolution maps out_channels to in_channels; its backward data
    // reads our x as its diff_dst and writes our y as its diff_src (same spatial size at
    // stride 1).
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
  p->diff_dst = memory(diff_dst_md, engine, DNNL_MEMORY_NONE);
  p->diff_src_written = memory(diff_src_md, engine, DNNL_MEMORY_NONE);
  p->diff_weights_written = memory(backward_weights_pd.diff_weights_desc(), engine);
  p->diff_weights_user = memory(diff_weights_md, engine, DNNL_MEMORY_NONE);
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(sum);
  p->add_diff_weights = dnnl::reorder(dnnl::reorder::primitive_desc(
      engine, backward_weights_pd.diff_weights_desc(), engine, diff_weights_md, attr));
  return p;
}

}  // namespace ft
