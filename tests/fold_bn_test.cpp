// Tests for inference.fold_bn (fusion/fold_bn_pass.cpp, fusion/ops/conv_bias.h): the fold's
// arithmetic against a double-precision reference, and folded eval graphs against the unfolded
// eval graph over the same parameters on real Fashion-MNIST test images, with BatchNorm
// statistics far from identity (random means, variances down to zero), eps 1e-5 and 1e-3, and
// both convolution algorithms; refolding after the parameters change; and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/image_data.h"
#include "core/rng.h"
#include "fusion/ops/conv_bias.h"
#include "fusion/pipeline.h"
#include "model/executor.h"
#include "model/ops/relu.h"
#include "model/resnet.h"
#include "tests/fold_test_util.h"

namespace ft {
namespace {

using fold_test::randomize_batchnorms;
using fold_test::test_images;

constexpr float kLogitTolerance = 1e-4f;  // relative to the largest |logit|

TEST(FoldBatchnorm, MatchesDoublePrecisionFormula) {
  const int out = 3;
  const int64_t per_channel = 4;
  std::vector<float> weight(out * per_channel), conv_bias = {0.5f, -1.0f, 2.0f};
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 0.1f * static_cast<float>(i) - 0.3f;
  const std::vector<float> gamma = {1.5f, -0.5f, 2.0f}, beta = {0.1f, 0.2f, -0.3f};
  const std::vector<float> mean = {0.2f, -3.0f, 7.0f}, var = {4.0f, 1e-7f, 0.0f};
  const double eps = 1e-3;
  for (bool affine : {true, false})
    for (bool has_bias : {true, false}) {
      std::vector<float> folded_weight(weight.size()), folded_bias(out);
      fold_batchnorm(folded_weight.data(), folded_bias.data(), weight.data(),
                     has_bias ? conv_bias.data() : nullptr, affine ? gamma.data() : nullptr,
                     affine ? beta.data() : nullptr, mean.data(), var.data(), eps, out,
                     per_channel);
      for (int o = 0; o < out; ++o) {
        const double scale = (affine ? gamma[o] : 1.0) / std::sqrt(var[o] + eps);
        for (int64_t i = 0; i < per_channel; ++i)
          EXPECT_FLOAT_EQ(folded_weight[o * per_channel + i],
                          static_cast<float>(weight[o * per_channel + i] * scale));
        const double expected =
            ((has_bias ? conv_bias[o] : 0.0) - mean[o]) * scale + (affine ? beta[o] : 0.0);
        EXPECT_FLOAT_EQ(folded_bias[o], static_cast<float>(expected)) << "channel " << o;
      }
    }
  std::vector<float> folded_weight(weight.size()), folded_bias(out);
  const std::vector<float> negative = {1.0f, -1.0f, 1.0f};
  EXPECT_THROW(
      fold_batchnorm(folded_weight.data(), folded_bias.data(), weight.data(), nullptr, nullptr,
                     nullptr, mean.data(), negative.data(), 1e-5, out, per_channel),
      Error);
}

// One ParamStore with an eager eval graph and a second eval graph after the pipeline.
struct FoldPair {
  ResnetShape shape{1, 16};
  ParamStore params;
  ResnetParamIds ids;
  Graph eager, fused;
  FusionResult fusion;
  std::unique_ptr<Executor> eager_executor, fused_executor;
  Workspace eager_ws, fused_ws;

  FoldPair(ConvAlgorithm algorithm, float eps, const FusionOptions& options, int batch,
           void (*edit)(Graph&) = nullptr) {
    shape.conv_algorithm = algorithm;
    shape.bn_eps = eps;
    ids = register_resnet_params(shape, params);
    params.allocate();
    params.initialize(11);
    randomize_batchnorms(params, 12);
    eager = build_resnet_graph(shape, batch, ids, GraphMode::kEval);
    fused = build_resnet_graph(shape, batch, ids, GraphMode::kEval);
    if (edit != nullptr) {
      edit(eager);
      edit(fused);
    }
    fusion = FusionPipeline::standard().run(fused, params, options);
    FusionOptions off;
    off.enabled = false;
    FusionPipeline::standard().run(eager, params, off);
    eager_executor = std::make_unique<Executor>(eager, params);
    fused_executor = std::make_unique<Executor>(fused, params);
    eager_ws = eager_executor->make_workspace();
    fused_ws = fused_executor->make_workspace();
    const ImageBatch& images = test_images(batch);
    for (Workspace* ws : {&eager_ws, &fused_ws}) {
      std::copy(images.images.begin(), images.images.end(), ws->values[eager.input].data());
      ws->targets = images.labels;
    }
  }

  void run() {
    eager_executor->forward(eager_ws);
    fused_executor->forward(fused_ws);
  }
  const Tensor& eager_logits() const { return eager_ws.values[eager.output]; }
  const Tensor& fused_logits() const { return fused_ws.values[fused.output]; }
  int count(OpKind kind) const {
    return static_cast<int>(std::count_if(fused.ops.begin(), fused.ops.end(),
                                          [&](const auto& op) { return op->op_kind() == kind; }));
  }
  const ConvBiasOp* conv_bias(const std::string& name) const {
    for (const auto& op : fused.ops)
      if (op->name == name) return dynamic_cast<const ConvBiasOp*>(op.get());
    return nullptr;
  }
};

float relative_diff(const Tensor& actual, const Tensor& expected) {
  float diff = 0.0f, scale = 0.0f;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    if (!std::isfinite(actual.data()[i])) return INFINITY;
    diff = std::max(diff, std::fabs(actual.data()[i] - expected.data()[i]));
    scale = std::max(scale, std::fabs(expected.data()[i]));
  }
  EXPECT_GT(scale, 0.0f);
  return diff / scale;
}

int prediction_agreement(const Tensor& a, const Tensor& b, int rows, int classes) {
  int agree = 0;
  for (int r = 0; r < rows; ++r) {
    const float* ra = a.data() + r * classes;
    const float* rb = b.data() + r * classes;
    agree += std::max_element(ra, ra + classes) - ra == std::max_element(rb, rb + classes) - rb;
  }
  return agree;
}

struct FoldCase {
  ConvAlgorithm algorithm;
  float eps;
};

class FoldedAgainstUnfolded : public ::testing::TestWithParam<FoldCase> {};

TEST_P(FoldedAgainstUnfolded, LogitsAndPredictionsAgree) {
  const int batch = 32;
  FoldPair pair(GetParam().algorithm, GetParam().eps, FusionOptions{}, batch);
  // Every conv folded: the stem and conv1s with their ReLU, conv2s with residual and ReLU.
  EXPECT_EQ(pair.count(OpKind::kConvBias), 9);
  EXPECT_EQ(pair.count(OpKind::kConv2d), 0);
  EXPECT_EQ(pair.count(OpKind::kBatchNormInference), 0);
  EXPECT_EQ(pair.count(OpKind::kRelu), 0);
  EXPECT_EQ(pair.count(OpKind::kResidualAdd), 0);
  pair.run();
  EXPECT_LT(relative_diff(pair.fused_logits(), pair.eager_logits()), kLogitTolerance);
  EXPECT_EQ(prediction_agreement(pair.fused_logits(), pair.eager_logits(), batch, 10), batch);
  const ConvBiasOp* conv2 = pair.conv_bias("layer1.0.conv2_bn");
  ASSERT_NE(conv2, nullptr);
  EXPECT_TRUE(conv2->spec().residual && conv2->spec().relu);
  const std::string impl = conv2->forward_impl();
  if (GetParam().algorithm == ConvAlgorithm::kAuto)
    EXPECT_EQ(impl, "winograd:f4x4_3x3+epilogue");
  else
    EXPECT_EQ(impl.find("winograd"), std::string::npos) << impl;
}

INSTANTIATE_TEST_SUITE_P(
    AlgorithmsAndEps, FoldedAgainstUnfolded,
    ::testing::Values(FoldCase{ConvAlgorithm::kAuto, 1e-5f}, FoldCase{ConvAlgorithm::kAuto, 1e-3f},
                      FoldCase{ConvAlgorithm::kOneDnn, 1e-5f},
                      FoldCase{ConvAlgorithm::kOneDnn, 1e-3f}),
    [](const ::testing::TestParamInfo<FoldCase>& info) {
      return std::string(info.param.algorithm == ConvAlgorithm::kAuto ? "winograd" : "onednn") +
             (info.param.eps < 1e-4f ? "_eps1e5" : "_eps1e3");
    });

TEST(FoldBn, BatchOfOneAgrees) {
  FoldPair pair(ConvAlgorithm::kAuto, 1e-5f, FusionOptions{}, 1);
  pair.run();
  EXPECT_LT(relative_diff(pair.fused_logits(), pair.eager_logits()), kLogitTolerance);
}

TEST(FoldBn, RefoldsWhenParametersChange) {
  FoldPair pair(ConvAlgorithm::kAuto, 1e-5f, FusionOptions{}, 8);
  pair.run();
  const std::vector<float> before(pair.fused_logits().data(),
                                  pair.fused_logits().data() + pair.fused_logits().numel());
  randomize_batchnorms(pair.params, 99);  // calls mark_changed, as an optimizer step does
  pair.run();
  EXPECT_LT(relative_diff(pair.fused_logits(), pair.eager_logits()), kLogitTolerance);
  float moved = 0.0f;
  for (size_t i = 0; i < before.size(); ++i)
    moved = std::max(moved, std::fabs(before[i] - pair.fused_logits().data()[i]));
  EXPECT_GT(moved, 1e-3f) << "new statistics should change the logits";
}

TEST(FoldBn, MaxOpsTwoFoldsOnlyConvAndBatchnorm) {
  FusionOptions options;
  options.max_ops = 2;
  FoldPair pair(ConvAlgorithm::kAuto, 1e-5f, options, 8);
  EXPECT_EQ(pair.count(OpKind::kConvBias), 9);
  EXPECT_EQ(pair.count(OpKind::kResidualAdd) + pair.count(OpKind::kAddRelu), 3);
  pair.run();
  EXPECT_LT(relative_diff(pair.fused_logits(), pair.eager_logits()), kLogitTolerance);
}

TEST(FoldBn, SwitchedOffLeavesConvAndBatchnorm) {
  FusionOptions options;
  options.fold_bn = false;
  FoldPair pair(ConvAlgorithm::kAuto, 1e-5f, options, 4);
  EXPECT_EQ(pair.count(OpKind::kConvBias), 0);
  EXPECT_EQ(pair.count(OpKind::kConv2d), 9);
}

TEST(FoldBn, TrainGraphIsRefusedWithReason) {
  ResnetShape shape{1, 16};
  ParamStore params;
  const ResnetParamIds ids = register_resnet_params(shape, params);
  params.allocate();
  params.initialize(3);
  Graph graph = build_resnet_graph(shape, 2, ids, GraphMode::kTrain);
  const FusionResult result = FusionPipeline::standard().run(graph, params, FusionOptions{});
  bool refused = false;
  for (const FusionDecision& decision : result.decisions)
    if (decision.pass == "fold_bn") {
      EXPECT_FALSE(decision.fused);
      refused = decision.reason.find("train graph") != std::string::npos;
    }
  EXPECT_TRUE(refused);
  for (const auto& op : graph.ops) EXPECT_NE(op->op_kind(), OpKind::kConvBias);
}

// A second reader of the stem's raw convolution output: appended at the end, it reads "conv1".
void add_reader_of_stem_conv(Graph& graph) {
  ValueId conv1 = -1;
  for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id)
    if (graph.values[id].name == "conv1") conv1 = id;
  ASSERT_GE(conv1, 0);
  const ValueId extra = graph.add_value("conv1_extra_reader", graph.shape(conv1));
  graph.add_op<ReluOp>("extra_relu", {conv1}, {extra}, {}, graph.numel(conv1));
}

TEST(FoldBn, ConvWithAnotherReaderIsSkippedWithReason) {
  FoldPair pair(ConvAlgorithm::kAuto, 1e-5f, FusionOptions{}, 4, add_reader_of_stem_conv);
  EXPECT_EQ(pair.count(OpKind::kConvBias), 8);
  bool skipped = false;
  for (const FusionDecision& decision : pair.fusion.decisions)
    if (decision.pass == "fold_bn" && decision.site == "conv1") {
      EXPECT_FALSE(decision.fused);
      skipped = decision.reason.find("2 consumers") != std::string::npos;
    }
  EXPECT_TRUE(skipped);
  pair.run();
  EXPECT_LT(relative_diff(pair.fused_logits(), pair.eager_logits()), kLogitTolerance);
}

// A ConvBiasOp run on its own: x [2,6,6,16] (and a residual like y), params registered here.
std::vector<float> run_conv_bias(const ConvBiasSpec& spec, ParamStore& params,
                                 const std::vector<ParamId>& ids) {
  ConvBiasOp op(spec, ConvBiasSource::kBatchNorm);
  op.name = "conv";
  op.inputs = {0};
  if (spec.residual) op.inputs.push_back(2);
  op.outputs = {1};
  op.params = ids;
  Workspace ws;
  Rng rng(8);
  ws.values = {Tensor::zeros({2, 6, 6, 16}), Tensor::zeros(op.output_shape()),
               Tensor::zeros(op.output_shape())};
  for (Tensor* t : {&ws.values[0], &ws.values[2]})
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = rng.normal();
  op.forward(ws, params);
  return std::vector<float>(ws.values[1].data(), ws.values[1].data() + ws.values[1].numel());
}

// BatchNorm without affine parameters folds as gamma = 1, beta = 0, on both kernels, with and
// without a residual and a ReLU.
TEST(ConvBiasOp, BatchnormWithoutAffineParametersEqualsUnitGammaZeroBeta) {
  ParamStore params;
  const ParamId weight = params.add("w", {16, 16, 3, 3}, ParamInit::kNormal, 0.2f, true);
  const ParamId gamma = params.add("gamma", {16}, ParamInit::kOnes, 0.0f, false);
  const ParamId beta = params.add("beta", {16}, ParamInit::kZeros, 0.0f, false);
  const ParamId mean = params.add("mean", {16}, ParamInit::kNormal, 0.5f, false);
  const ParamId var = params.add("var", {16}, ParamInit::kOnes, 0.0f, false);
  params.allocate();
  params.initialize(9);
  for (bool winograd : {true, false})
    for (bool residual : {true, false}) {
      ConvBiasSpec spec;
      spec.batch = 2, spec.in_channels = 16, spec.out_channels = 16, spec.height = 6,
      spec.width = 6, spec.kernel = 3, spec.padding = 1;
      spec.winograd = winograd;
      spec.residual = residual;
      spec.relu = !residual;
      spec.eps = 1e-3f;
      const std::vector<float> affine =
          run_conv_bias(spec, params, {weight, gamma, beta, mean, var});
      spec.bn_affine = false;
      const std::vector<float> plain = run_conv_bias(spec, params, {weight, mean, var});
      ASSERT_EQ(affine.size(), plain.size());
      float diff = 0.0f, scale = 0.0f;
      for (size_t i = 0; i < affine.size(); ++i) {
        diff = std::max(diff, std::fabs(affine[i] - plain[i]));
        scale = std::max(scale, std::fabs(affine[i]));
      }
      EXPECT_GT(scale, 0.0f);
      EXPECT_LE(diff, 1e-6f * scale) << "winograd " << winograd << " residual " << residual;
    }
}

}  // namespace
}  // namespace ft
