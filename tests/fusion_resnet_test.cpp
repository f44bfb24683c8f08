// Tests for the fused ops of the ResNet fusions (fusion.vertical.bn_relu and
// fusion.horizontal.conv_shortcut; the passes are tested in fusion_resnet_pass_test.cpp). Each
// fused op runs against its unfused twin on the same random inputs and parameters through the
// Executor: BatchNormReluOp against BatchNorm2dOp + ReluOp (and the eval variant against
// BatchNormInferenceOp + ReluOp), AddReluOp against ResidualAddOp + ReluOp, ConvShortcutOp
// against two Conv2dOps. Forward outputs and every input and parameter gradient must agree within
// 1e-5 of the largest, with input gradients prefilled with NaN so an incomplete fresh overwrite
// cannot pass, and running statistics must be identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "fusion/ops/add_relu.h"
#include "fusion/ops/batchnorm_relu.h"
#include "fusion/ops/conv_shortcut.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/batchnorm.h"
#include "model/ops/batchnorm_inference.h"
#include "model/ops/conv2d.h"
#include "model/ops/relu.h"
#include "model/ops/residual.h"

namespace ft {
namespace {

constexpr float kTolerance = 1e-5f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// max |actual - expected| over max |expected|; infinite if any actual entry is not finite.
float rel_diff(const Tensor& actual, const Tensor& expected) {
  EXPECT_EQ(actual.numel(), expected.numel());
  float diff = 0.0f, scale = 0.0f;
  for (int64_t i = 0; i < std::min(actual.numel(), expected.numel()); ++i) {
    if (!std::isfinite(actual.data()[i])) return std::numeric_limits<float>::infinity();
    diff = std::max(diff, std::fabs(actual.data()[i] - expected.data()[i]));
    scale = std::max(scale, std::fabs(expected.data()[i]));
  }
  EXPECT_GT(scale, 0.0f) << "an all-zero reference makes the comparison vacuous";
  return scale > 0.0f ? diff / scale : diff;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::equal(a.data(), a.data() + a.numel(), b.data());
}

// One side of a twin: ops over `inputs` producing `results`, each closed by its own weighted-sum
// loss (so every result element carries a distinct gradient), summed into graph.loss.
struct Side {
  ParamStore params;
  Graph graph;
  std::vector<ValueId> inputs, results;
  std::unique_ptr<Executor> executor;
  Workspace ws;

  ValueId input(const std::string& name, const Shape& shape) {
    inputs.push_back(graph.add_value(name, shape));
    return inputs.back();
  }
  void finish(uint64_t seed) {
    ValueId loss = add_weighted_sum_loss(graph, results[0], 7);
    for (size_t i = 1; i < results.size(); ++i) {
      const ValueId more = add_weighted_sum_loss(graph, results[i], 7 + i);
      const ValueId sum = graph.add_value("loss_sum", {1});
      graph.add_op<ResidualAddOp>("loss_sum", {loss, more}, {sum}, {}, 1);
      loss = sum;
    }
    graph.loss = loss;
    params.allocate();
    params.initialize(seed);
    executor = std::make_unique<Executor>(graph, params);
    ws = executor->make_workspace();
    Rng rng(seed + 1);
    for (ValueId id : inputs)
      for (int64_t i = 0; i < ws.values[id].numel(); ++i) ws.values[id].data()[i] = rng.normal();
  }
  // Forward, then backward with every input gradient prefilled with NaN: each is fresh for its
  // last reader, which must overwrite all of it.
  void step() {
    params.zero_grads();
    executor->forward(ws);
    if (graph.mode == GraphMode::kEval) return;
    for (ValueId id : inputs) ws.grads[id].fill(kNaN);
    executor->backward(ws);
  }
  Op& op(int index) { return *graph.ops[index]; }
};

// Forward results, input gradients and trainable parameter gradients of the two sides agree.
void expect_twins_agree(Side& fused, Side& unfused) {
  for (size_t i = 0; i < unfused.results.size(); ++i)
    EXPECT_LT(rel_diff(fused.ws.values[fused.results[i]], unfused.ws.values[unfused.results[i]]),
              kTolerance)
        << "result " << i;
  if (unfused.graph.mode == GraphMode::kEval) return;
  for (size_t i = 0; i < unfused.inputs.size(); ++i)
    EXPECT_LT(rel_diff(fused.ws.grads[fused.inputs[i]], unfused.ws.grads[unfused.inputs[i]]),
              kTolerance)
        << "gradient of input " << i;
  for (ParamId id = 0; id < unfused.params.size(); ++id) {
    if (!unfused.params[id].trainable) continue;
    EXPECT_LT(rel_diff(fused.params[id].grad, unfused.params[id].grad), kTolerance)
        << unfused.params[id].name;
  }
}

// ---- BatchNormReluOp against BatchNorm2dOp + ReluOp ----

// NHWC [3, 7, 7, C]: 147 rows, one full reduction chunk and an odd remainder; C = 3 runs only
// the scalar channel loop, C = 11 a vector block and a scalar tail, C = 16 two vector blocks.
constexpr int kB = 3, kH = 7, kW = 7;

void build_batchnorm(Side& side, int channels, bool fused, GraphMode mode) {
  side.graph.mode = mode;
  const Shape shape{kB, kH, kW, channels};
  const ValueId x = side.input("x", shape);
  const std::vector<ParamId> ids = {
      side.params.add("weight", {channels}, ParamInit::kNormal, 1.0f, false),
      side.params.add("bias", {channels}, ParamInit::kNormal, 1.0f, false),
      side.params.add_buffer("running_mean", {channels}, ParamInit::kZeros),
      side.params.add_buffer("running_var", {channels}, ParamInit::kOnes)};
  const ValueId y = side.graph.add_value("y", shape);
  side.results = {y};
  const bool eval = mode == GraphMode::kEval;
  if (fused && eval) {
    side.graph.add_op<BatchNormInferenceReluOp>("bn_relu", {x}, {y}, ids, kB, channels, kH, kW);
  } else if (fused) {
    side.graph.add_op<BatchNormReluOp>("bn_relu", {x}, {y}, ids, kB, channels, kH, kW, 0.25f);
  } else {
    const ValueId z = side.graph.add_value("z", shape);
    if (eval)
      side.graph.add_op<BatchNormInferenceOp>("bn", {x}, {z}, ids, kB, channels, kH, kW);
    else
      side.graph.add_op<BatchNorm2dOp>("bn", {x}, {z}, ids, kB, channels, kH, kW, 0.25f);
    side.graph.add_op<ReluOp>("relu", {z}, {y}, {}, shape_numel(shape));
  }
  side.finish(31);
  for (int c = 0; c < channels; ++c) {
    side.params[ids[2]].value.data()[c] = 0.5f - 0.3f * c;
    side.params[ids[3]].value.data()[c] = 0.25f + 0.5f * c;
  }
  // Per-channel offsets and scales, so statistics differ between channels.
  float* data = side.ws.values[x].data();
  for (int64_t i = 0; i < side.ws.values[x].numel(); ++i) {
    const int c = static_cast<int>(i % channels);
    data[i] = (c % 4 + 1.0f) * data[i] + 2.0f * c - 1.0f;
  }
}

class BatchNormReluTwin : public ::testing::TestWithParam<int> {};

TEST_P(BatchNormReluTwin, MatchesBatchNormThenReluWithFreshAndAccumulatedGradients) {
  Side fused, unfused;
  build_batchnorm(fused, GetParam(), true, GraphMode::kTrain);
  build_batchnorm(unfused, GetParam(), false, GraphMode::kTrain);
  for (int round = 0; round < 2; ++round) {  // the second forward starts from moved statistics
    fused.step();
    unfused.step();
    expect_twins_agree(fused, unfused);
    // The CPU recomputes the ReLU mask from x (BatchNormMask::kRecomputed): the same mask as
    // the unfused ReLU's y > 0, so the same input gradient to the bit.
    EXPECT_TRUE(bitwise_equal(fused.ws.grads[fused.inputs[0]], unfused.ws.grads[unfused.inputs[0]]))
        << "round " << round;
    for (ParamId id : {2, 3})
      EXPECT_TRUE(bitwise_equal(fused.params[id].value, unfused.params[id].value))
          << fused.params[id].name << " differs after round " << round;
  }
  // The mask must matter: some outputs cut, some passed.
  const Tensor& y = fused.ws.values[fused.results[0]];
  const int64_t positives =
      std::count_if(y.data(), y.data() + y.numel(), [](float v) { return v > 0; });
  EXPECT_GT(positives, y.numel() / 5);
  EXPECT_LT(positives, 4 * y.numel() / 5);
  // With fresh gradients off every op accumulates into zeroed buffers: the same result.
  Side accumulated;
  build_batchnorm(accumulated, GetParam(), true, GraphMode::kTrain);
  accumulated.executor->set_fresh_gradients(false);
  accumulated.step();
  accumulated.step();
  expect_twins_agree(accumulated, unfused);
  EXPECT_LT(backward_accumulation_error(accumulated.op(0), accumulated.ws, accumulated.params),
            1e-6f);
}

TEST_P(BatchNormReluTwin, EvalVariantMatchesInferenceBatchNormThenRelu) {
  Side fused, unfused;
  build_batchnorm(fused, GetParam(), true, GraphMode::kEval);
  build_batchnorm(unfused, GetParam(), false, GraphMode::kEval);
  fused.step();
  unfused.step();
  EXPECT_TRUE(
      bitwise_equal(fused.ws.values[fused.results[0]], unfused.ws.values[unfused.results[0]]));
  EXPECT_THROW(fused.op(0).backward(fused.ws, fused.params), Error);
}

INSTANTIATE_TEST_SUITE_P(Channels, BatchNormReluTwin, ::testing::Values(3, 11, 16),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "c" + std::to_string(info.param);
                         });

// ---- AddReluOp against ResidualAddOp + ReluOp ----

void build_add(Side& side, bool fused) {
  const Shape shape{2, 5, 5, 9};
  const ValueId a = side.input("a", shape), b = side.input("b", shape);
  const ValueId y = side.graph.add_value("y", shape);
  side.results = {y};
  if (fused) {
    side.graph.add_op<AddReluOp>("add_relu", {a, b}, {y}, {}, shape_numel(shape));
  } else {
    const ValueId sum = side.graph.add_value("sum", shape);
    side.graph.add_op<ResidualAddOp>("add", {a, b}, {sum}, {}, shape_numel(shape));
    side.graph.add_op<ReluOp>("relu", {sum}, {y}, {}, shape_numel(shape));
  }
  side.finish(41);
}

TEST(AddReluTwin, MatchesResidualAddThenRelu) {
  Side fused, unfused;
  build_add(fused, true);
  build_add(unfused, false);
  fused.step();
  unfused.step();
  expect_twins_agree(fused, unfused);
  EXPECT_LT(backward_accumulation_error(fused.op(0), fused.ws, fused.params), 1e-6f);
}

// ---- ConvShortcutOp against a 3x3 and a 1x1 Conv2dOp ----

struct ConvCase {
  int in_channels, out_channels, size, stride;
};

void build_convs(Side& side, const ConvCase& c, bool fused) {
  const ValueId x = side.input("x", {2, c.size, c.size, c.in_channels});
  const int out = (c.size - 1) / c.stride + 1;
  const ParamId wide = side.params.add("conv1.weight", {c.out_channels, c.in_channels, 3, 3},
                                       ParamInit::kNormal, 0.3f, true);
  const ParamId narrow = side.params.add(
      "downsample.0.weight", {c.out_channels, c.in_channels, 1, 1}, ParamInit::kNormal, 0.3f, true);
  const ValueId y3 = side.graph.add_value("conv1", {2, out, out, c.out_channels});
  const ValueId y1 = side.graph.add_value("downsample.0", {2, out, out, c.out_channels});
  side.results = {y3, y1};
  if (fused) {
    side.graph.add_op<ConvShortcutOp>("conv1_shortcut", {x}, {y3, y1}, {wide, narrow}, 2,
                                      c.in_channels, c.out_channels, c.size, c.size, c.stride);
  } else {
    side.graph.add_op<Conv2dOp>("conv1", {x}, {y3}, {wide}, 2, c.in_channels, c.out_channels,
                                c.size, c.size, 3, c.stride, 1);
    side.graph.add_op<Conv2dOp>("downsample.0", {x}, {y1}, {narrow}, 2, c.in_channels,
                                c.out_channels, c.size, c.size, 1, c.stride, 0);
  }
  side.finish(51);
}

class ConvShortcutTwin : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvShortcutTwin, MatchesTwoConvolutions) {
  Side fused, unfused;
  build_convs(fused, GetParam(), true);
  build_convs(unfused, GetParam(), false);
  fused.step();
  unfused.step();
  expect_twins_agree(fused, unfused);
  EXPECT_LT(backward_accumulation_error(fused.op(0), fused.ws, fused.params), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvShortcutTwin,
                         ::testing::Values(ConvCase{16, 32, 14, 2},  // resnet8 layer2, odd output
                                           ConvCase{8, 16, 9, 2},    // odd input: border taps
                                           ConvCase{3, 5, 8, 2},     // tiny, scalar channels
                                           ConvCase{16, 16, 6, 1}),  // stride 1 works too
                         [](const ::testing::TestParamInfo<ConvCase>& info) {
                           const ConvCase& c = info.param;
                           return "in" + std::to_string(c.in_channels) + "_out" +
                                  std::to_string(c.out_channels) + "_s" + std::to_string(c.size) +
                                  "_stride" + std::to_string(c.stride);
                         });

}  // namespace
}  // namespace ft
