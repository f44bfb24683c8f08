// Graphs of the ResNet's ops shared by the device comparisons (tests/device_compare_util.h):
// tests/cuda_resnet_ops_test.cpp runs them in fp32, tests/cuda_resnet_bf16_test.cpp with the
// convolution's input cast to bf16 (train.precision: bf16).
// Thread safety: builders only; the calling thread.
#pragma once
#include <string>
#include <vector>

#include "device_compare_util.h"
#include "model/ops/cast.h"
#include "model/ops/conv2d.h"

namespace ft::test {

struct ConvCase {
  int batch, in_channels, out_channels, size, kernel, stride, padding;
  bool nchw_input;
};

inline int conv_out(const ConvCase& c) {
  return (c.size + 2 * c.padding - c.kernel) / c.stride + 1;
}

// An fp32 root `name` of `shape`; for a bf16 `dtype` cast by a CastOp (one row per innermost
// dimension) into "<name>.bf16", which is returned.
inline ValueId input_value(Graph& graph, const std::string& name, const Shape& shape, DType dtype) {
  const ValueId x = graph.add_value(name, shape);
  if (dtype == DType::kF32) return x;
  const ValueId y = graph.add_value(name + ".bf16", shape, DType::kBF16);
  const int64_t cols = shape.back();
  graph.add_op<CastOp>(name + ".bf16", {x}, {y}, {}, shape_numel(shape) / cols, cols);
  return y;
}

// One Conv2dOp of case `c` reading x in `input` (bf16: the weight's bf16 copy too), y fp32 into
// a weighted-sum loss.
inline device_compare::GraphBuilder conv_builder(const ConvCase& c, DType input) {
  return [c, input](Graph& graph, ParamStore& params) {
    if (input == DType::kBF16) params.enable_bf16_copies();
    const ValueId x = input_value(graph, "x",
                                  c.nchw_input ? Shape{c.batch, c.in_channels, c.size, c.size}
                                               : Shape{c.batch, c.size, c.size, c.in_channels},
                                  input);
    const int out = conv_out(c);
    const ValueId y = graph.add_value("y", {c.batch, out, out, c.out_channels});
    const ParamId w = params.add("conv.weight", {c.out_channels, c.in_channels, c.kernel, c.kernel},
                                 ParamInit::kNormal, 0.1f, true);
    Conv2dOp& conv =
        graph.add_op<Conv2dOp>("conv", {x}, {y}, {w}, c.batch, c.in_channels, c.out_channels,
                               c.size, c.size, c.kernel, c.stride, c.padding);
    if (c.nchw_input) conv.input_layout = ActivationLayout::kNchw;
    add_weighted_sum_loss(graph, y, 3);
  };
}

// The four BatchNorm params "<name>.weight", ".bias", ".running_mean", ".running_var" in the order
// every op of the family reads them.
inline std::vector<ParamId> add_batchnorm_params(ParamStore& params, int channels,
                                                 const std::string& name = "bn") {
  return {params.add(name + ".weight", {channels}, ParamInit::kOnes, 0.0f, false),
          params.add(name + ".bias", {channels}, ParamInit::kZeros, 0.0f, false),
          params.add_buffer(name + ".running_mean", {channels}, ParamInit::kZeros),
          params.add_buffer(name + ".running_var", {channels}, ParamInit::kOnes)};
}

}  // namespace ft::test
