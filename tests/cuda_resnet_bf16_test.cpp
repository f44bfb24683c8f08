// The ResNet under train.precision: bf16 on a GPU against the CPU's bf16 path, op by op through
// tests/device_compare_util.h (every value, gradient, parameter gradient, buffer and the loss),
// then resnet8 training a few steps: Conv2dOp (cuDNN's bf16 convolutions, model/ops/
// conv2d_bf16.cu) on the ResNet's shapes, ConvShortcutOp and the eval graph's ConvBiasOp, and the
// producers that write a convolution's bf16 operand themselves (ReluCastOp, BatchNormReluOp,
// BatchNormAddReluOp with either shortcut), each read by a bf16 Linear. Compiled, not yet run on
// a GPU; skips without a usable device (and runs CPU against CPU as emulated_cuda_resnet_bf16).
// Tolerances:
//   - Convolutions: the GPU rounds each convolution output (y, dx, dW's contribution) to bf16
//     before widening it (cuDNN's PSEUDO_BFLOAT16_CONFIG), the CPU keeps them fp32: up to 2^-8
//     of the element itself (half an ulp of rounding, and a last-bit flip where fp32 sums in
//     another order land near a tie). A gradient that adds such a contribution to the harness's
//     noise can cancel towards zero, so these compare each tensor normwise, max |a - b| against
//     max |b|: kConvNormwise = 2e-2, five times 2^-8.
//   - Producers writing bf16: the value both devices round is computed alike up to fp32 order
//     (batch statistics), so a few elements may land on the neighbouring bf16 value (2^-8
//     relative), which the Linear reading them carries: 1e-2, as tests/cuda_bf16_ops_test.cpp.
//     ReluCastOp rounds the same fp32 inputs bit for bit: 1e-4 (the reader's fp32 sums).
//   - Training: each step's loss within 3e-2 of the CPU's over 5 steps (the conv roundings move
//     every activation by up to 2^-9; 20 fp32 steps stay within 2e-3 in tests/cuda_train_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/training/trainer.h"
#include "cuda_test_util.h"
#include "device_compare_util.h"
#include "fusion/ops/batchnorm_add_relu.h"
#include "fusion/ops/batchnorm_relu.h"
#include "fusion/ops/conv_bias.h"
#include "fusion/ops/conv_shortcut.h"
#include "fusion/ops/relu_cast.h"
#include "model/ops/cast.h"
#include "model/ops/conv2d.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"
#include "resnet_device_graphs.h"
#include "train_compare_util.h"

namespace ft {
namespace {

using device_compare::DeviceRun;
using device_compare::GraphBuilder;

constexpr double kConvNormwise = 2e-2;
constexpr double kRoundedActivations = 1e-2;
constexpr double kSameOperands = 1e-4;

// max |a - b| / max |b| over one tensor; NaN or a size mismatch counts as 1e30.
double normwise_error(const std::vector<float>& actual, const std::vector<float>& expected) {
  if (actual.size() != expected.size()) return 1e30;
  double worst = 0.0, largest = 1e-30;
  for (size_t i = 0; i < expected.size(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(expected[i])));
    const double error = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    if (!(error <= worst)) worst = std::isnan(error) ? 1e30 : error;
  }
  return worst / largest;
}

// Every tensor of two runs within `tolerance` normwise (see the file comment).
void expect_runs_close_normwise(const DeviceRun& actual, const DeviceRun& expected,
                                double tolerance) {
  ASSERT_EQ(actual.names, expected.names);
  auto check = [tolerance](const std::string& what, const std::vector<float>& a,
                           const std::vector<float>& b) {
    const double error = normwise_error(a, b);
    EXPECT_LE(error, tolerance) << what << ": max |cuda - cpu| / max |cpu| = " << error;
  };
  for (size_t v = 0; v < actual.names.size(); ++v) {
    check("value " + actual.names[v], actual.values[v], expected.values[v]);
    check("grad of " + actual.names[v], actual.grads[v], expected.grads[v]);
  }
  check("parameter gradients", actual.param_grads, expected.param_grads);
  check("buffers", actual.buffers, expected.buffers);
  check("loss", {actual.loss}, {expected.loss});
}

DeviceRun run_cpu(const GraphBuilder& build) {
  return device_compare::run_on(Device::kCpu, build, {});
}
DeviceRun run_gpu(const GraphBuilder& build) {
  return device_compare::run_on(test::kGpu, build, {});
}

// An fp32 root cast to bf16 by a CastOp: the bf16 value.
ValueId bf16_input(Graph& graph, const std::string& name, const Shape& shape) {
  return test::input_value(graph, name, shape, DType::kBF16);
}

// A bf16 Linear over the channels of `x` [pixels, channels] into an fp32 loss input: the reader of
// a producer's bf16 output, whose gradient it hands back in fp32.
void add_bf16_reader(Graph& graph, ParamStore& params, ValueId x, int64_t pixels,
                     int64_t channels) {
  const ValueId z = graph.add_value("reader.out", {pixels, 8});
  const ParamId w = params.add("reader.w", {8, channels}, ParamInit::kNormal, 0.5f, true);
  graph.add_op<LinearOp>("reader", {x}, {z}, {w}, pixels, channels, int64_t{8}, false, int64_t{0});
  add_weighted_sum_loss(graph, z, 12);
}

// ---- Conv2dOp ----

using test::ConvCase;

class CudaResnetBf16Conv2d : public ::testing::TestWithParam<ConvCase> {};

// x cast to bf16, the convolution reading the weight's bf16 copy, y fp32 into the loss.
TEST_P(CudaResnetBf16Conv2d, MatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  const GraphBuilder build = test::conv_builder(GetParam(), DType::kBF16);
  expect_runs_close_normwise(run_gpu(build), run_cpu(build), kConvNormwise);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaResnetBf16Conv2d,
    ::testing::Values(ConvCase{2, 16, 16, 8, 3, 1, 1, false},   // 3x3 "same"
                      ConvCase{2, 8, 16, 9, 3, 2, 1, false},    // 3x3 stride 2, odd size
                      ConvCase{2, 8, 16, 8, 1, 2, 0, false},    // 1x1 downsample
                      ConvCase{2, 3, 16, 10, 3, 1, 1, true},    // the stem: NCHW images
                      ConvCase{2, 1, 16, 10, 3, 1, 1, true}));  // one channel (Fashion-MNIST)

// ---- ConvShortcutOp and ConvBiasOp ----

// The downsampling block's merged 3x3 + 1x1 on a bf16 x, and its unfused twin, the two
// convolutions reading x (the first backward overwrites the fresh dx, the second adds to it); a
// residual add joins the two branches.
TEST(CudaResnetBf16ConvShortcut, FusedAndTheTwoConvolutionsMatchCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "conv_shortcut" : "two convolutions");
    const GraphBuilder build = [fused](Graph& graph, ParamStore& params) {
      params.enable_bf16_copies();
      const Shape out_shape{2, 4, 4, 16};
      const ValueId x = bf16_input(graph, "x", {2, 8, 8, 8});
      const ValueId y3 = graph.add_value("conv1", out_shape);
      const ValueId y1 = graph.add_value("downsample.0", out_shape);
      const ValueId y = graph.add_value("y", out_shape);
      const ParamId wide =
          params.add("conv1.weight", {16, 8, 3, 3}, ParamInit::kNormal, 0.1f, true);
      const ParamId narrow =
          params.add("downsample.0.weight", {16, 8, 1, 1}, ParamInit::kNormal, 0.1f, true);
      if (fused) {
        graph.add_op<ConvShortcutOp>("conv1_shortcut", {x}, {y3, y1}, {wide, narrow}, 2, 8, 16, 8,
                                     8, 2);
      } else {
        graph.add_op<Conv2dOp>("conv1", {x}, {y3}, {wide}, 2, 8, 16, 8, 8, 3, 2, 1);
        graph.add_op<Conv2dOp>("downsample.0", {x}, {y1}, {narrow}, 2, 8, 16, 8, 8, 1, 2, 0);
      }
      graph.add_op<ResidualAddOp>("join", {y3, y1}, {y}, {}, shape_numel(out_shape));
      add_weighted_sum_loss(graph, y, 10);
    };
    expect_runs_close_normwise(run_gpu(build), run_cpu(build), kConvNormwise);
  }
}

// The eval graph's folded convolution on a bf16 x (W' rounded to bf16 on both devices), with
// and without the residual and ReLU epilogue.
TEST(CudaResnetBf16ConvBias, MatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const bool epilogue : {false, true}) {
    SCOPED_TRACE(epilogue ? "residual + relu" : "bias only");
    const GraphBuilder build = [epilogue](Graph& graph, ParamStore& params) {
      graph.mode = GraphMode::kEval;
      params.enable_bf16_copies();
      const Shape out_shape{2, 8, 8, 16};
      const ValueId x = bf16_input(graph, "x", {2, 8, 8, 16});
      const ValueId y = graph.add_value("y", out_shape);
      const ParamId w = params.add("conv.weight", {16, 16, 3, 3}, ParamInit::kNormal, 0.1f, true);
      const std::vector<ParamId> bn = test::add_batchnorm_params(params, 16);
      ConvBiasSpec spec;
      spec.batch = 2;
      spec.in_channels = spec.out_channels = 16;
      spec.height = spec.width = 8;
      spec.kernel = 3;
      spec.padding = 1;
      spec.residual = spec.relu = epilogue;
      std::vector<ValueId> inputs{x};
      if (epilogue) inputs.push_back(graph.add_value("residual", out_shape));
      graph.add_op<ConvBiasOp>("conv_bias", inputs, {y}, {w, bn[0], bn[1], bn[2], bn[3]}, spec,
                               ConvBiasSource::kBatchNorm);
      add_weighted_sum_loss(graph, y, 11);
    };
    expect_runs_close_normwise(run_gpu(build), run_cpu(build), kConvNormwise);
  }
}

// ---- Producers writing a convolution's bf16 operand (fusion.vertical.cast) ----

constexpr int kBatch = 2, kSize = 6, kChannels = 16;
constexpr int64_t kPixels = int64_t{kBatch} * kSize * kSize;
const Shape kActivation{kBatch, kSize, kSize, kChannels};

std::vector<ParamId> add_batchnorm_params(ParamStore& params, const std::string& name) {
  return test::add_batchnorm_params(params, kChannels, name);
}

// A producer writing y [kActivation] in bf16 from the fp32 root x (and any other inputs it
// adds), read by a bf16 Linear, on both devices.
using ProducerBuilder = std::function<void(Graph&, ParamStore&, ValueId x, ValueId y)>;

void expect_producer_matches_cpu(const ProducerBuilder& producer, double tolerance) {
  const GraphBuilder build = [producer](Graph& graph, ParamStore& params) {
    params.enable_bf16_copies();
    const ValueId x = graph.add_value("x", kActivation);
    const ValueId y = graph.add_value("y", kActivation, DType::kBF16);
    producer(graph, params, x, y);
    add_bf16_reader(graph, params, y, kPixels, kChannels);
  };
  device_compare::expect_runs_close(run_gpu(build), run_cpu(build), tolerance, tolerance);
}

TEST(CudaResnetBf16Producers, ReluCastMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_producer_matches_cpu(
      [](Graph& graph, ParamStore&, ValueId x, ValueId y) {
        graph.add_op<ReluCastOp>("relu_cast", {x}, {y}, {}, shape_numel(kActivation));
      },
      kSameOperands);
}

TEST(CudaResnetBf16Producers, BatchNormReluWritingBf16MatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_producer_matches_cpu(
      [](Graph& graph, ParamStore& params, ValueId x, ValueId y) {
        graph.add_op<BatchNormReluOp>("bn_relu", {x}, {y}, add_batchnorm_params(params, "bn"),
                                      kBatch, kChannels, kSize, kSize, 0.25f);
      },
      kRoundedActivations);
}

TEST(CudaResnetBf16Producers, BatchNormAddReluWritingBf16MatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (const bool normalised : {false, true}) {
    SCOPED_TRACE(normalised ? "normalised shortcut" : "identity shortcut");
    expect_producer_matches_cpu(
        [normalised](Graph& graph, ParamStore& params, ValueId x, ValueId y) {
          const ValueId r = graph.add_value(normalised ? "x_s" : "r", kActivation);
          std::vector<ParamId> ids = add_batchnorm_params(params, "bn");
          const BatchNormSettings settings{0.25f, 1e-5f};
          if (normalised) {
            const std::vector<ParamId> shortcut = add_batchnorm_params(params, "bn_s");
            ids.insert(ids.end(), shortcut.begin(), shortcut.end());
          }
          graph.add_op<BatchNormAddReluOp>("bn_add_relu", {x, r}, {y}, ids, kBatch, kChannels,
                                           kSize, kSize, settings,
                                           normalised ? &settings : nullptr);
        },
        kRoundedActivations);
  }
}

// ---- resnet8 ----

Config resnet8_bf16(const std::string& device, bool fused) {
  return load_config(std::string(FT_SOURCE_DIR) + "/configs/resnet8.yaml",
                     {"train.device=" + device, "train.steps=5", "optim.warmup_steps=2",
                      "train.batch_size=16", "train.precision=bf16", "data.test_limit=256",
                      "fusion.enabled=" + std::string(fused ? "true" : "false")});
}

// Eager (Conv2dOp, ReLU and casts) and fused (BatchNorm+ReLU and BatchNorm+add+ReLU writing
// bf16, the folded eval graph): the losses of the CPU's bf16 run, step by step, and eval.
TEST(CudaResnetBf16Train, Resnet8FiveStepsMatchTheCpuFusedAndEager) {
  FT_SKIP_WITHOUT_GPU();
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "eager");
    Trainer on_cpu(resnet8_bf16("cpu", fused), nullptr);
    Trainer on_gpu(resnet8_bf16(test::kGpuName, fused), nullptr);
    test::expect_training_tracks_cpu(on_cpu, on_gpu, 5, 3e-2, 2);
  }
}

}  // namespace
}  // namespace ft
