#include "model/resnet.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "model/gemm_input_casts.h"
#include "model/ops/batchnorm.h"
#include "model/ops/batchnorm_inference.h"
#include "model/ops/conv2d.h"
#include "model/ops/cross_entropy.h"
#include "model/ops/global_avg_pool.h"
#include "model/ops/linear.h"
#include "model/ops/relu.h"
#include "model/ops/residual.h"

namespace ft {

const char* conv_algorithm_name(ConvAlgorithm algorithm) {
  switch (algorithm) {
    case ConvAlgorithm::kOneDnn:
      return "onednn";
    case ConvAlgorithm::kMeasure:
      return "measure";
    default:
      return "auto";
  }
}

bool conv_algorithm_from_name(const std::string& name, ConvAlgorithm* algorithm) {
  for (ConvAlgorithm candidate :
       {ConvAlgorithm::kAuto, ConvAlgorithm::kOneDnn, ConvAlgorithm::kMeasure})
    if (name == conv_algorithm_name(candidate)) {
      *algorithm = candidate;
      return true;
    }
  return false;
}
namespace {

constexpr int kStages = 3;

int stage_width(const ResnetShape& shape, int stage) {
  return shape.width << stage;
}

// Kaiming normal, fan_out mode with the ReLU gain, as torchvision initialises ResNet convs.
ParamId add_conv(ParamStore& params, const std::string& name, int out_channels, int in_channels,
                 int kernel) {
  const float init_std = std::sqrt(2.0f / static_cast<float>(out_channels * kernel * kernel));
  return params.add(name, {out_channels, in_channels, kernel, kernel}, ParamInit::kNormal, init_std,
                    /*weight_decay=*/true);
}

BatchNormParamIds add_batchnorm(ParamStore& params, const std::string& prefix, int channels) {
  BatchNormParamIds ids;
  ids.weight = params.add(prefix + ".weight", {channels}, ParamInit::kOnes, 0.0f, false);
  ids.bias = params.add(prefix + ".bias", {channels}, ParamInit::kZeros, 0.0f, false);
  ids.running_mean = params.add_buffer(prefix + ".running_mean", {channels}, ParamInit::kZeros);
  ids.running_var = params.add_buffer(prefix + ".running_var", {channels}, ParamInit::kOnes);
  return ids;
}

void check_shape(const ResnetShape& shape) {
  FT_CHECK(shape.blocks_per_stage >= 1 && shape.width >= 1 && shape.image_size >= 1 &&
               shape.in_channels >= 1 && shape.classes >= 2 && shape.bn_eps > 0.0f,
           "resnet: bad shape blocks_per_stage=", shape.blocks_per_stage, " width=", shape.width,
           " image_size=", shape.image_size, " in_channels=", shape.in_channels,
           " classes=", shape.classes, " bn_eps=", shape.bn_eps,
           " (need blocks_per_stage >= 1, width >= 1, image_size >= 1, in_channels >= 1,"
           " classes >= 2, bn_eps > 0)");
}

// Appends ops to a graph while tracking the current activation's channels and spatial size.
class ResnetGraphBuilder {
 public:
  ResnetGraphBuilder(int batch, ConvAlgorithm conv_algorithm, float bn_eps, DType gemm_dtype)
      : batch_(batch), conv_algorithm_(conv_algorithm), bn_eps_(bn_eps), gemm_inputs_(gemm_dtype) {}

  Graph& graph() { return graph_; }

  // x as a GEMM reads it (model/gemm_input_casts.h).
  ValueId gemm_input(ValueId x) { return gemm_inputs_(graph_, x); }

  ValueId conv(const std::string& name, ValueId x, ParamId weight, int in_channels,
               int out_channels, int size, int kernel, int stride, int padding) {
    const int out_size = (size + 2 * padding - kernel) / stride + 1;
    const ValueId y = graph_.add_value(name, {batch_, out_size, out_size, out_channels});
    Conv2dOp& op =
        graph_.add_op<Conv2dOp>(name, {gemm_input(x)}, {y}, {weight}, batch_, in_channels,
                                out_channels, size, size, kernel, stride, padding);
    op.algorithm = conv_algorithm_;
    if (x == graph_.input) {  // the images: NCHW as loaded, and no gradient needed
      op.input_layout = ActivationLayout::kNchw;
      op.needs_input_grad = false;
    }
    return y;
  }

  ValueId batchnorm(const std::string& name, ValueId x, const BatchNormParamIds& ids) {
    const Shape shape = graph_.shape(x);  // [B, H, W, C]
    const ValueId y = graph_.add_value(name, shape);
    const std::vector<ParamId> params = {ids.weight, ids.bias, ids.running_mean, ids.running_var};
    const int channels = static_cast<int>(shape[3]), height = static_cast<int>(shape[1]),
              width = static_cast<int>(shape[2]);
    // Training normalises with batch statistics, evaluation with the running ones: two op kinds,
    // so no op branches on a mode flag and BN folding can match the inference one.
    if (graph_.mode == GraphMode::kEval)
      graph_.add_op<BatchNormInferenceOp>(name, {x}, {y}, params, batch_, channels, height, width,
                                          bn_eps_);
    else
      graph_.add_op<BatchNorm2dOp>(name, {x}, {y}, params, batch_, channels, height, width, 0.1f,
                                   bn_eps_);
    return y;
  }

  ValueId relu(const std::string& name, ValueId x) {
    const Shape shape = graph_.shape(x);
    const ValueId y = graph_.add_value(name, shape);
    graph_.add_op<ReluOp>(name, {x}, {y}, {}, shape_numel(shape));
    return y;
  }

  ValueId add(const std::string& name, ValueId a, ValueId b) {
    const Shape shape = graph_.shape(a);
    FT_CHECK(shape == graph_.shape(b), "resnet: residual '", name, "' adds ", shape_str(shape),
             " and ", shape_str(graph_.shape(b)));
    const ValueId y = graph_.add_value(name, shape);
    graph_.add_op<ResidualAddOp>(name, {a, b}, {y}, {}, shape_numel(shape));
    return y;
  }

  ValueId basic_block(const std::string& prefix, ValueId x, const BasicBlockParamIds& ids,
                      int in_channels, int out_channels, int size, int stride) {
    const int out_size = (size + 2 - 3) / stride + 1;
    ValueId h =
        conv(prefix + ".conv1", x, ids.conv1, in_channels, out_channels, size, 3, stride, 1);
    h = batchnorm(prefix + ".bn1", h, ids.bn1);
    h = relu(prefix + ".relu1", h);
    h = conv(prefix + ".conv2", h, ids.conv2, out_channels, out_channels, out_size, 3, 1, 1);
    h = batchnorm(prefix + ".bn2", h, ids.bn2);
    ValueId shortcut = x;
    if (ids.has_downsample) {
      shortcut = conv(prefix + ".downsample.0", x, ids.downsample_conv, in_channels, out_channels,
                      size, 1, stride, 0);
      shortcut = batchnorm(prefix + ".downsample.1", shortcut, ids.downsample_bn);
    }
    h = add(prefix + ".add", h, shortcut);
    return relu(prefix + ".relu2", h);
  }

 private:
  Graph graph_;
  int batch_;
  ConvAlgorithm conv_algorithm_;
  float bn_eps_;
  GemmInputCasts gemm_inputs_;
};

}  // namespace

ResnetParamIds register_resnet_params(const ResnetShape& shape, ParamStore& params) {
  check_shape(shape);
  ResnetParamIds ids;
  ids.conv1 = add_conv(params, "conv1.weight", shape.width, shape.in_channels, 3);
  ids.bn1 = add_batchnorm(params, "bn1", shape.width);
  int in_channels = shape.width;
  for (int stage = 0; stage < kStages; ++stage) {
    const int out_channels = stage_width(shape, stage);
    std::vector<BasicBlockParamIds> blocks;
    for (int block = 0; block < shape.blocks_per_stage; ++block) {
      const std::string prefix = "layer" + std::to_string(stage + 1) + "." + std::to_string(block);
      BasicBlockParamIds b;
      b.conv1 = add_conv(params, prefix + ".conv1.weight", out_channels, in_channels, 3);
      b.bn1 = add_batchnorm(params, prefix + ".bn1", out_channels);
      b.conv2 = add_conv(params, prefix + ".conv2.weight", out_channels, out_channels, 3);
      b.bn2 = add_batchnorm(params, prefix + ".bn2", out_channels);
      b.has_downsample = block == 0 && stage > 0;
      if (b.has_downsample) {
        b.downsample_conv =
            add_conv(params, prefix + ".downsample.0.weight", out_channels, in_channels, 1);
        b.downsample_bn = add_batchnorm(params, prefix + ".downsample.1", out_channels);
      }
      blocks.push_back(b);
      in_channels = out_channels;
    }
    ids.layers.push_back(std::move(blocks));
  }
  // nn.Linear's default init is uniform(+-1/sqrt(in)); a normal with that std is close enough.
  const int features = stage_width(shape, kStages - 1);
  ids.fc_weight = params.add("fc.weight", {shape.classes, features}, ParamInit::kNormal,
                             1.0f / std::sqrt(static_cast<float>(features)), true);
  ids.fc_bias = params.add("fc.bias", {shape.classes}, ParamInit::kZeros, 0.0f, false);
  return ids;
}

Graph build_resnet_graph(const ResnetShape& shape, int batch, const ResnetParamIds& ids,
                         GraphMode mode, DType gemm_dtype) {
  check_shape(shape);
  FT_CHECK(batch >= 1, "resnet: batch must be positive, got ", batch);
  FT_CHECK(static_cast<int>(ids.layers.size()) == kStages, "resnet: parameter ids hold ",
           ids.layers.size(), " stages, expected ", kStages);
  ResnetGraphBuilder builder(batch, shape.conv_algorithm, shape.bn_eps, gemm_dtype);
  Graph& graph = builder.graph();
  graph.mode = mode;
  graph.input =
      graph.add_value("images", {batch, shape.in_channels, shape.image_size, shape.image_size});
  int size = shape.image_size;
  ValueId h =
      builder.conv("conv1", graph.input, ids.conv1, shape.in_channels, shape.width, size, 3, 1, 1);
  h = builder.batchnorm("bn1", h, ids.bn1);
  h = builder.relu("relu", h);
  int in_channels = shape.width;
  for (int stage = 0; stage < kStages; ++stage) {
    const int out_channels = stage_width(shape, stage);
    FT_CHECK(static_cast<int>(ids.layers[stage].size()) == shape.blocks_per_stage,
             "resnet: parameter ids hold ", ids.layers[stage].size(), " blocks in stage ",
             stage + 1, ", shape says ", shape.blocks_per_stage);
    for (int block = 0; block < shape.blocks_per_stage; ++block) {
      const int stride = (block == 0 && stage > 0) ? 2 : 1;
      const std::string prefix = "layer" + std::to_string(stage + 1) + "." + std::to_string(block);
      h = builder.basic_block(prefix, h, ids.layers[stage][block], in_channels, out_channels, size,
                              stride);
      size = (size - 1) / stride + 1;
      in_channels = out_channels;
    }
  }
  const ValueId pooled = graph.add_value("avgpool", {batch, in_channels});
  graph.add_op<GlobalAvgPoolOp>("avgpool", {h}, {pooled}, {}, batch, in_channels, size, size);
  graph.output = graph.add_value("fc", {batch, shape.classes});
  graph.add_op<LinearOp>("fc", {builder.gemm_input(pooled)}, {graph.output},
                         {ids.fc_weight, ids.fc_bias}, batch, in_channels, shape.classes, true);
  graph.loss = graph.add_value("loss", {1});
  graph.add_op<SoftmaxCrossEntropyOp>("loss", {graph.output}, {graph.loss}, {}, batch,
                                      shape.classes);
  return std::move(builder.graph());
}

Graph build_resnet(const ResnetShape& shape, int batch, ParamStore& params, GraphMode mode,
                   DType gemm_dtype) {
  const ResnetParamIds ids = register_resnet_params(shape, params);
  return build_resnet_graph(shape, batch, ids, mode, gemm_dtype);
}

}  // namespace ft
