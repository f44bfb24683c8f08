// ConvBiasOp: fold, then one convolution whose epilogue adds the bias and the residual and applies
// the ReLU (see conv_bias.h for the algebra).
#include "fusion/ops/conv_bias.h"

#include <cmath>
#include <cstring>
#include <dnnl.hpp>
#include <string>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/dnnl_context.h"
#include "core/gemm.h"
#include "model/ops/op_checks.h"
#include "model/ops/winograd.h"

namespace ft {

void fold_batchnorm(float* folded_weight, float* folded_bias, const float* weight,
                    const float* conv_bias, const float* gamma, const float* beta,
                    const float* running_mean, const float* running_var, double eps,
                    int out_channels, int64_t per_channel) {
  for (int o = 0; o < out_channels; ++o) {
    const double variance = static_cast<double>(running_var[o]) + eps;
    FT_REQUIRE(variance > 0.0 && std::isfinite(variance), "fold_bn: channel ", o,
               " has running_var + eps = ", variance, "; it must be positive");
    const double scale =
        fold_batchnorm_scale<double>(gamma != nullptr ? gamma[o] : 1.0, running_var[o], eps);
    const float* from = weight + o * per_channel;
    float* to = folded_weight + o * per_channel;
    for (int64_t i = 0; i < per_channel; ++i)
      to[i] = static_cast<float>(fold_batchnorm_weight<double>(from[i], scale));
    folded_bias[o] = static_cast<float>(
        fold_batchnorm_bias<double>(conv_bias != nullptr ? conv_bias[o] : 0.0, running_mean[o],
                                    scale, beta != nullptr ? beta[o] : 0.0));
  }
}

ConvBiasSpec conv_bias_spec(const Conv2dOp& conv) {
  ConvBiasSpec spec;
  spec.batch = conv.batch();
  spec.in_channels = conv.in_channels();
  spec.out_channels = conv.out_channels();
  spec.height = conv.height();
  spec.width = conv.width();
  spec.kernel = conv.kernel();
  spec.stride = conv.stride();
  spec.padding = conv.padding();
  spec.input_layout = conv.input_layout;
  spec.winograd = conv.resolved_algorithm() == ConvAlgorithm::kWinograd;
  spec.winograd_tile = conv.winograd_tile;
  return spec;
}

struct ConvBiasOp::Kernels {
  uint64_t version = 0;  // ParamStore::version() the weights below were derived at
  bool ready = false;
  DType input = DType::kF32;  // the input's dtype the kernels were made for
  // bf16 input: oneDNN's bf16 kernel reads x as it is; otherwise x is widened into wide_input.
  bool native_bf16 = false;
  bool winograd = false;  // spec_.winograd, unless oneDNN's bf16 kernel runs
  std::vector<float> wide_input;
  std::vector<float> weight, bias;  // W' [out, in, k, k] (bf16-rounded for a bf16 x) and b' [out]
  std::vector<float> winograd_weights;
  dnnl::convolution_forward forward;  // when !winograd
  dnnl::memory src, dst, bias_memory, user_weights, prim_weights;
  dnnl::reorder reorder_weights;  // user_weights -> prim_weights, when their layouts differ
  bool reordered = false;
  std::string impl;
};

ConvBiasOp::ConvBiasOp(const ConvBiasSpec& spec, ConvBiasSource source)
    : spec_(spec), source_(source) {
  FT_CHECK(spec.batch > 0 && spec.in_channels > 0 && spec.out_channels > 0 && spec.height > 0 &&
               spec.width > 0 && spec.kernel > 0 && spec.stride > 0 && spec.padding >= 0 &&
               spec.height + 2 * spec.padding >= spec.kernel &&
               spec.width + 2 * spec.padding >= spec.kernel,
           "conv_bias: bad sizes");
  FT_CHECK(!spec.winograd || (spec.kernel == 3 && spec.stride == 1 && spec.padding == 1 &&
                              spec.input_layout == ActivationLayout::kNhwc &&
                              winograd_supports(spec.in_channels, spec.out_channels)),
           "conv_bias: Winograd needs a 3x3 stride-1 padding-1 NHWC convolution with 16k channels");
  out_height_ = (spec.height + 2 * spec.padding - spec.kernel) / spec.stride + 1;
  out_width_ = (spec.width + 2 * spec.padding - spec.kernel) / spec.stride + 1;
}

ConvBiasOp::~ConvBiasOp() = default;

Shape ConvBiasOp::output_shape() const {
  return {spec_.batch, out_height_, out_width_, spec_.out_channels};
}

Shape ConvBiasOp::weight_shape() const {
  return {spec_.out_channels, spec_.in_channels, spec_.kernel, spec_.kernel};
}

const char* ConvBiasOp::forward_impl() const {
  return kernels_ ? kernels_->impl.c_str() : "";
}

void ConvBiasOp::folded(const ParamStore& params, std::vector<float>* weight,
                        std::vector<float>* bias) const {
  // Parameters on the device are folded from a host copy (see conv_bias.h).
  std::vector<std::vector<float>> host_copies;
  std::vector<const float*> slots;
  host_copies.reserve(this->params.size());  // the pointers in `slots` stay valid
  for (size_t slot = 0; slot < this->params.size(); ++slot) {
    const Tensor& value = params[this->params[slot]].value;
    if (value.device() == Device::kCpu) {
      slots.push_back(value.data());
      continue;
    }
    host_copies.push_back(value.to_host_vector());
    slots.push_back(host_copies.back().data());
  }
  fold_params(slots, weight, bias);
}

void ConvBiasOp::fold_params(const std::vector<const float*>& slots, std::vector<float>* weight,
                             std::vector<float>* bias) const {
  const int64_t weight_numel = shape_numel(weight_shape());
  weight->resize(weight_numel);
  bias->resize(spec_.out_channels);
  const auto data = [&](int slot) { return slots.at(slot); };
  if (source_ == ConvBiasSource::kFolded) {
    std::memcpy(weight->data(), data(0), weight_numel * sizeof(float));
    std::memcpy(bias->data(), data(1), spec_.out_channels * sizeof(float));
    return;
  }
  const int stats = spec_.bn_affine ? 3 : 1;  // slot of running_mean
  fold_batchnorm(weight->data(), bias->data(), data(0), nullptr,
                 spec_.bn_affine ? data(1) : nullptr, spec_.bn_affine ? data(2) : nullptr,
                 data(stats), data(stats + 1), spec_.eps, spec_.out_channels,
                 weight_numel / spec_.out_channels);
}

void ConvBiasOp::check_wiring(const Workspace& ws, const ParamStore& params) const {
  const size_t param_count = source_ == ConvBiasSource::kFolded ? 2 : (spec_.bn_affine ? 5 : 3);
  expect_arity(*this, spec_.residual ? 2 : 1, 1, param_count);
  const int64_t in_numel =
      static_cast<int64_t>(spec_.batch) * spec_.in_channels * spec_.height * spec_.width;
  expect_numel(ws.values[inputs[0]], in_numel, *this, "x");
  expect_numel(ws.values[outputs[0]], shape_numel(output_shape()), *this, "y");
  if (spec_.residual)
    expect_numel(ws.values[inputs[1]], shape_numel(output_shape()), *this, "residual");
  expect_numel(params[this->params[0]].value, shape_numel(weight_shape()), *this, "weight");
  for (size_t slot = 1; slot < param_count; ++slot)
    expect_numel(params[this->params[slot]].value, spec_.out_channels, *this, "channel param");
}

// oneDNN's inference convolution with the bias, residual and ReLU as post-ops; x in `operands`
// (bf16 on the native path, with W' reordered to bf16), y fp32. False when bf16 operands would
// run oneDNN's reference kernel, orders slower than widening to fp32.
bool ConvBiasOp::make_onednn_kernel(DType operands) {
  using dnnl::memory;
  using tag = memory::format_tag;
  Kernels& k = *kernels_;
  const auto f32 = memory::data_type::f32;
  const auto operand_type = operands == DType::kBF16 ? memory::data_type::bf16 : f32;
  dnnl::engine& engine = cpu_engine();
  // As in Conv2dOp: with one channel nchw and nhwc are the same bytes.
  const bool src_nchw = spec_.input_layout == ActivationLayout::kNchw && spec_.in_channels > 1;
  const memory::desc src_md({spec_.batch, spec_.in_channels, spec_.height, spec_.width},
                            operand_type, src_nchw ? tag::nchw : tag::nhwc);
  const memory::desc dst_md({spec_.batch, spec_.out_channels, out_height_, out_width_}, f32,
                            tag::nhwc);
  const memory::dims weight_dims{spec_.out_channels, spec_.in_channels, spec_.kernel, spec_.kernel};
  const memory::desc bias_md({spec_.out_channels}, f32, tag::x);
  const memory::dims strides{spec_.stride, spec_.stride};
  const memory::dims padding{spec_.padding, spec_.padding};
  dnnl::post_ops post_ops;
  if (spec_.residual) post_ops.append_sum(1.0f);  // y holds the residual before the call
  if (spec_.relu) post_ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(post_ops);
  dnnl::convolution_forward::primitive_desc pd;
  try {
    pd = dnnl::convolution_forward::primitive_desc(
        {dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_md,
         memory::desc(weight_dims, operand_type, tag::any), bias_md, dst_md, strides, padding,
         padding},
        attr, engine);
  } catch (const dnnl::error&) {
    if (operands == DType::kBF16) return false;
    throw;
  }
  k.impl = pd.impl_info_str();
  if (operands == DType::kBF16 && k.impl.rfind("ref", 0) == 0) return false;
  FT_CHECK(pd.src_desc() == src_md && pd.dst_desc() == dst_md, "conv_bias '", name,
           "': oneDNN changed an activation layout");
  k.forward = dnnl::convolution_forward(pd);
  k.src = memory(src_md, engine, DNNL_MEMORY_NONE);
  k.dst = memory(dst_md, engine, DNNL_MEMORY_NONE);
  k.bias_memory = memory(bias_md, engine, DNNL_MEMORY_NONE);
  // W' stays fp32 in oihw; a bf16 primitive's reorder converts it (exactly: it is bf16-rounded).
  const memory::desc user_md(weight_dims, f32, tag::oihw);
  k.user_weights = memory(user_md, engine, DNNL_MEMORY_NONE);
  k.reordered = !(pd.weights_desc() == user_md);
  k.prim_weights = k.reordered ? memory(pd.weights_desc(), engine) : k.user_weights;
  if (k.reordered) k.reorder_weights = dnnl::reorder(k.user_weights, k.prim_weights);
  return true;
}

void ConvBiasOp::prepare(ParamStore& params, DType input) {
  if (!kernels_) {
    kernels_ = std::make_unique<Kernels>();
    kernels_->input = input;
    kernels_->winograd = spec_.winograd;
  }
  Kernels& k = *kernels_;
  FT_CHECK(k.input == input, "conv_bias '", name, "': built for a ", dtype_name(k.input),
           " input, given ", dtype_name(input));
  if (!k.ready && input == DType::kBF16 && bf16_gemm_native()) {
    k.native_bf16 = make_onednn_kernel(DType::kBF16);
    if (k.native_bf16) k.winograd = false;  // bf16 runs oneDNN's direct kernel
  }
  folded(params, &k.weight, &k.bias);
  // A bf16 x multiplies the bf16 copy of W', as a training convolution its weight's.
  if (input == DType::kBF16)
    for (float& w : k.weight) w = round_to_bf16(w);
  if (k.winograd) {
    k.winograd_weights.resize(
        winograd_weights_numel(spec_.in_channels, spec_.out_channels, spec_.winograd_tile));
    winograd_transform_weights(k.winograd_weights.data(), k.weight.data(), spec_.out_channels,
                               spec_.in_channels, spec_.winograd_tile, WinogradPass::kForward);
    if (!k.ready)
      k.impl = spec_.winograd_tile == WinogradTile::k2x2 ? "winograd:f2x2_3x3+epilogue"
                                                         : "winograd:f4x4_3x3+epilogue";
  } else {
    if (!k.ready && !k.native_bf16) make_onednn_kernel(DType::kF32);
    k.user_weights.set_data_handle(k.weight.data());
    if (k.reordered) k.reorder_weights.execute(cpu_stream(), k.user_weights, k.prim_weights);
    k.bias_memory.set_data_handle(k.bias.data());
    cpu_stream().wait();
  }
  if (!k.ready && input == DType::kBF16 && !k.native_bf16) k.impl = "widened:" + k.impl;
  k.version = params.version();
  k.ready = true;
}

void ConvBiasOp::forward(Workspace& ws, ParamStore& params) {
  check_wiring(ws, params);
  const Tensor& input = ws.values[inputs[0]];
  FT_RUN_ON_CUDA(ws, forward_cuda(ws, params));
  if (!kernels_ || !kernels_->ready || kernels_->version != params.version())
    prepare(params, input.dtype());
  Kernels& k = *kernels_;
  float* y = ws.values[outputs[0]].data();
  const void* x = nullptr;
  if (input.dtype() == DType::kF32) {
    x = input.data();
  } else if (k.native_bf16) {
    x = input.bf16_data();
  } else {
    k.wide_input.resize(static_cast<size_t>(input.numel()));
    cast_to_float(k.wide_input.data(), input.bf16_data(), input.numel());
    x = k.wide_input.data();
  }
  const float* residual = spec_.residual ? ws.values[inputs[1]].data() : nullptr;
  if (k.winograd) {
    WinogradEpilogue epilogue;
    epilogue.bias = k.bias.data();
    epilogue.residual = residual;
    epilogue.relu = spec_.relu;
    winograd_conv_inference(y, static_cast<const float*>(x), k.winograd_weights.data(),
                            {spec_.batch, spec_.height, spec_.width, spec_.in_channels,
                             spec_.out_channels, spec_.winograd_tile},
                            epilogue);
    return;
  }
  if (residual != nullptr) {  // the sum post-op adds what y holds
    const int64_t count = shape_numel(output_shape());
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < count; ++i) y[i] = residual[i];
  }
  k.src.set_data_handle(const_cast<void*>(x));
  k.dst.set_data_handle(y);
  k.forward.execute(cpu_stream(), {{DNNL_ARG_SRC, k.src},
                                   {DNNL_ARG_WEIGHTS, k.prim_weights},
                                   {DNNL_ARG_BIAS, k.bias_memory},
                                   {DNNL_ARG_DST, k.dst}});
  cpu_stream().wait();
}

void ConvBiasOp::backward(Workspace&, ParamStore&) {
  FT_FAIL("conv_bias '", name, "': eval graph has no backward");
}

OpCost ConvBiasOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = static_cast<double>(spec_.batch) * out_height_ * out_width_ *
                      spec_.out_channels * spec_.in_channels * spec_.kernel * spec_.kernel;
  const double outputs = static_cast<double>(shape_numel(output_shape()));
  cost.forward_flops = 2 * macs + outputs * (1 + spec_.residual + spec_.relu);
  cost.backward_flops = 0;
  return cost;
}

}  // namespace ft
