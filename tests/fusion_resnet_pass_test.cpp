// Tests for the ResNet fusion passes fusion.vertical.bn_relu and fusion.horizontal.conv_shortcut
// on a tiny ResNet (blocks 1, width 4: two downsampling blocks) and a hand-built graph: they
// fuse where they should, skip every other candidate with a reason, respect max_ops and
// max_padding_overhead, and keep the loss, logits, every parameter gradient and the running
// statistics of the eager graph. The fused ops themselves are tested against their twins in
// fusion_resnet_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "fusion/ops/batchnorm_add_relu.h"
#include "fusion/passes.h"
#include "fusion/pipeline.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/batchnorm.h"
#include "model/ops/relu.h"
#include "model/ops/residual.h"
#include "model/resnet.h"

namespace ft {
namespace {

constexpr float kTolerance = 1e-5f;

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

// A tiny ResNet whose graph ran through `passes` (none: the eager graph) before the executor.
struct ResnetRun {
  ResnetShape shape{1, 4};
  ParamStore params;
  ResnetParamIds ids;
  Graph graph;
  FusionResult fusion;
  std::unique_ptr<Executor> executor;
  Workspace ws;

  ResnetRun(GraphMode mode, const FusionPipeline& passes, const FusionOptions& options,
            int batch = 4) {
    ids = register_resnet_params(shape, params);
    graph = build_resnet_graph(shape, batch, ids, mode);
    params.allocate();
    params.initialize(5);
    fusion = passes.run(graph, params, options);
    executor = std::make_unique<Executor>(graph, params);
    ws = executor->make_workspace();
    Rng rng(6);
    Tensor& images = ws.values[graph.input];
    for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = rng.normal();
    for (int b = 0; b < batch; ++b) ws.targets.push_back(static_cast<int32_t>(rng.below(10)));
  }
  int count(OpKind kind) const {
    return static_cast<int>(std::count_if(graph.ops.begin(), graph.ops.end(),
                                          [&](const auto& op) { return op->op_kind() == kind; }));
  }
  std::vector<FusionDecision> decisions(bool fused) const {
    std::vector<FusionDecision> matching;
    for (const FusionDecision& d : fusion.decisions)
      if (d.fused == fused) matching.push_back(d);
    return matching;
  }
  void step() {
    params.zero_grads();
    executor->forward(ws);
    if (graph.mode == GraphMode::kTrain) executor->backward(ws);
  }
};

FusionPipeline only(std::unique_ptr<FusionPass> pass) {
  FusionPipeline pipeline;
  pipeline.add(std::move(pass));
  return pipeline;
}

FusionPipeline resnet_passes() {
  FusionPipeline pipeline;
  pipeline.add(make_conv_shortcut_pass());
  pipeline.add(make_bn_relu_pass());
  return pipeline;
}

FusionOptions padding_allowed() {
  FusionOptions options;
  options.horizontal.max_padding_overhead = 1.0;
  return options;
}

FusionOptions with_max_ops(int max_ops) {
  FusionOptions options;
  options.max_ops = max_ops;
  return options;
}

TEST(BnReluPass, FusesEveryBatchNormAndAddFollowedByARelu) {
  const ResnetRun run(GraphMode::kTrain, only(make_bn_relu_pass()), FusionOptions{});
  // stem bn1 and each block's bn1 feed a ReLU; each add takes in bn2 and, in the two
  // downsampling blocks, the shortcut's BN.
  EXPECT_EQ(run.count(OpKind::kBatchNormRelu), 4);
  EXPECT_EQ(run.count(OpKind::kBatchNormAddRelu), 3);
  EXPECT_EQ(run.count(OpKind::kAddRelu), 0);
  EXPECT_EQ(run.count(OpKind::kBatchNorm), 0);
  EXPECT_EQ(run.count(OpKind::kRelu), 0);
  EXPECT_EQ(run.count(OpKind::kResidualAdd), 0);
  const std::vector<FusionDecision> fused = run.decisions(true);
  ASSERT_EQ(fused.size(), 7u);
  EXPECT_EQ(fused[0].site, "bn1");
  EXPECT_EQ(fused[0].ops_absorbed, 2);
  std::vector<int> absorbed_by_adds;
  for (const FusionDecision& d : fused)
    if (d.reason.find("batchnorm_add_relu") != std::string::npos)
      absorbed_by_adds.push_back(d.ops_absorbed);
  EXPECT_EQ(absorbed_by_adds, (std::vector<int>{3, 4, 4}));
  int normalised = 0;
  for (const auto& op : run.graph.ops) {
    if (op->op_kind() == OpKind::kBatchNormRelu) {
      EXPECT_EQ(op->eager_ops, 2) << op->name;
    }
    if (op->op_kind() != OpKind::kBatchNormAddRelu) continue;
    const auto& fused_op = static_cast<const BatchNormAddReluOp&>(*op);
    normalised += fused_op.normalised_shortcut();
    EXPECT_EQ(op->params.size(), fused_op.normalised_shortcut() ? 8u : 4u) << op->name;
    EXPECT_EQ(op->eager_ops, fused_op.normalised_shortcut() ? 4 : 3) << op->name;
  }
  EXPECT_EQ(normalised, 2);
  EXPECT_TRUE(run.decisions(false).empty());
}

TEST(BnReluPass, MaxOpsTwoKeepsTheBatchNormsBeforeTheAdd) {
  const ResnetRun run(GraphMode::kTrain, only(make_bn_relu_pass()), with_max_ops(2));
  EXPECT_EQ(run.count(OpKind::kBatchNormRelu), 4);
  EXPECT_EQ(run.count(OpKind::kAddRelu), 3);
  EXPECT_EQ(run.count(OpKind::kBatchNormAddRelu), 0);
  EXPECT_EQ(run.count(OpKind::kBatchNorm), 5);
  const std::vector<FusionDecision> skipped = run.decisions(false);
  ASSERT_EQ(skipped.size(), 5u);
  EXPECT_EQ(skipped[0].site, "layer1.0.bn2");
  for (const FusionDecision& d : skipped) EXPECT_EQ(d.reason, "max_ops 2") << d.site;
}

TEST(BnReluPass, MaxOpsThreeTakesOneBatchNormPerAdd) {
  const ResnetRun run(GraphMode::kTrain, only(make_bn_relu_pass()), with_max_ops(3));
  EXPECT_EQ(run.count(OpKind::kBatchNormAddRelu), 3);
  EXPECT_EQ(run.count(OpKind::kBatchNorm), 2);  // the shortcut BNs
  for (const auto& op : run.graph.ops) {
    if (op->op_kind() != OpKind::kBatchNormAddRelu) continue;
    EXPECT_FALSE(static_cast<const BatchNormAddReluOp&>(*op).normalised_shortcut()) << op->name;
    EXPECT_EQ(op->eager_ops, 3) << op->name;
  }
  const std::vector<FusionDecision> skipped = run.decisions(false);
  ASSERT_EQ(skipped.size(), 2u);
  for (const FusionDecision& d : skipped) {
    EXPECT_NE(d.site.find("downsample"), std::string::npos) << d.site;
    EXPECT_EQ(d.reason, "max_ops 3");
  }
}

TEST(BnReluPass, EvalGraphsGetTheRunningStatisticsVariant) {
  const ResnetRun run(GraphMode::kEval, only(make_bn_relu_pass()), FusionOptions{});
  EXPECT_EQ(run.count(OpKind::kBatchNormInferenceRelu), 4);
  EXPECT_EQ(run.count(OpKind::kBatchNormRelu), 0);
  EXPECT_EQ(run.count(OpKind::kAddRelu), 3);
  EXPECT_EQ(run.count(OpKind::kBatchNormAddRelu), 0);  // train graphs only
  EXPECT_EQ(run.count(OpKind::kBatchNormInference), 5);
}

TEST(BnReluPass, LeavesABatchNormWithTwoConsumersAlone) {
  ParamStore params;
  Graph graph;
  const Shape shape{2, 3, 3, 4};
  const ValueId x = graph.add_value("x", shape);
  const std::vector<ParamId> ids = {params.add("weight", {4}, ParamInit::kOnes, 0.0f, false),
                                    params.add("bias", {4}, ParamInit::kZeros, 0.0f, false),
                                    params.add_buffer("running_mean", {4}, ParamInit::kZeros),
                                    params.add_buffer("running_var", {4}, ParamInit::kOnes)};
  params.allocate();
  const ValueId z = graph.add_value("z", shape), r = graph.add_value("r", shape);
  graph.input = x;
  graph.add_op<BatchNorm2dOp>("bn", {x}, {z}, ids, 2, 4, 3, 3);
  graph.add_op<ReluOp>("relu", {z}, {r}, {}, shape_numel(shape));
  graph.output = graph.add_value("sum", shape);
  graph.add_op<ResidualAddOp>("sum", {z, r}, {graph.output}, {}, shape_numel(shape));
  add_weighted_sum_loss(graph, graph.output, 3);
  const FusionResult result = only(make_bn_relu_pass()).run(graph, params, FusionOptions{});
  ASSERT_EQ(graph.ops.size(), 4u);
  EXPECT_EQ(graph.ops[0]->op_kind(), OpKind::kBatchNorm);
  EXPECT_EQ(graph.ops[1]->op_kind(), OpKind::kRelu);
  ASSERT_EQ(result.decisions.size(), 2u);
  EXPECT_FALSE(result.decisions[0].fused);
  EXPECT_EQ(result.decisions[0].site, "bn");
  EXPECT_EQ(result.decisions[0].reason, "output has 2 consumers");
  EXPECT_EQ(result.decisions[1].site, "sum");
  EXPECT_FALSE(result.decisions[1].fused);
}

TEST(ConvShortcutPass, RefusesAtTheDefaultOverheadWithTheFigure) {
  const ResnetRun run(GraphMode::kTrain, only(make_conv_shortcut_pass()), FusionOptions{});
  EXPECT_EQ(run.count(OpKind::kConvShortcut), 0);
  EXPECT_EQ(run.count(OpKind::kConv2d), 9);
  ASSERT_EQ(run.fusion.decisions.size(), 2u);
  EXPECT_EQ(run.fusion.decisions[0].site, "layer2.0.conv1");
  EXPECT_EQ(run.fusion.decisions[1].site, "layer3.0.conv1");
  for (const FusionDecision& d : run.fusion.decisions) {
    EXPECT_FALSE(d.fused);
    EXPECT_EQ(d.pass, "conv_shortcut");
    EXPECT_EQ(d.reason, "padding overhead 0.80 > 0.25");
  }
}

TEST(ConvShortcutPass, FusesDownsamplingBlocksWhenThePaddingIsAllowed) {
  const ResnetRun run(GraphMode::kTrain, only(make_conv_shortcut_pass()), padding_allowed());
  EXPECT_EQ(run.count(OpKind::kConvShortcut), 2);
  EXPECT_EQ(run.count(OpKind::kConv2d), 5);
  const std::vector<FusionDecision> fused = run.decisions(true);
  ASSERT_EQ(fused.size(), 2u);
  EXPECT_EQ(fused[0].site, "layer2.0.conv1");
  EXPECT_EQ(fused[0].ops_absorbed, 2);
  EXPECT_TRUE(run.decisions(false).empty());
  for (const auto& op : run.graph.ops) {
    if (op->op_kind() != OpKind::kConvShortcut) continue;
    EXPECT_EQ(op->eager_ops, 2);
    EXPECT_EQ(op->outputs.size(), 2u);
    EXPECT_EQ(op->params.size(), 2u);  // the two canonical tensors
  }
}

TEST(ResnetPasses, MaxOpsOneFusesNothingAndSaysSo) {
  FusionOptions options = padding_allowed();
  options.max_ops = 1;
  const ResnetRun run(GraphMode::kTrain, resnet_passes(), options);
  EXPECT_EQ(run.graph.ops.size(), 3u + 7 + 9 + 9 + 3);
  EXPECT_TRUE(run.decisions(true).empty());
  int capped = 0;
  for (const FusionDecision& d : run.fusion.decisions) capped += d.reason == "max_ops 1";
  // two conv pairs, four BN+ReLU, three add+ReLU and the five BNs before the adds
  EXPECT_EQ(capped, 2 + 7 + 5);
}

// One step of each: the same logits, every parameter gradient and the running statistics.
void expect_same_step(ResnetRun& fused, ResnetRun& eager) {
  fused.step();
  eager.step();
  EXPECT_LT(rel_diff(fused.ws.values[fused.graph.output], eager.ws.values[eager.graph.output]),
            kTolerance);
  for (ParamId id = 0; id < eager.params.size(); ++id) {
    const bool trainable = eager.params[id].trainable;
    // Gradients of trainable tensors; values of the running statistics.
    EXPECT_LT(trainable ? rel_diff(fused.params[id].grad, eager.params[id].grad)
                        : rel_diff(fused.params[id].value, eager.params[id].value),
              kTolerance)
        << eager.params[id].name;
  }
}

// Both passes on against the eager graph: the same loss, logits, every parameter gradient and
// running statistics after one step, and a 20-step SGD loss trajectory within 1e-4. Only the
// first step's gradients are compared tightly: the padded convolution rounds differently (BN
// and ReLU fusion alone are bitwise equal), and once SGD moves an activation to within that
// rounding of a ReLU kink the runs take different sides of it. At lr 0.1 and 0.05 that happens
// within a few steps, and the losses part by ~1e-2 exactly as when one weight of the eager run
// is scaled by 1 + 1e-6; at lr 0.02 neither perturbation moves the loss by more than 2.4e-7.
TEST(ResnetPasses, FusedModelMatchesTheEagerOne) {
  ResnetRun fused(GraphMode::kTrain, resnet_passes(), padding_allowed());
  ResnetRun eager(GraphMode::kTrain, FusionPipeline{}, FusionOptions{});
  ASSERT_EQ(fused.count(OpKind::kConvShortcut), 2);
  ASSERT_EQ(fused.count(OpKind::kBatchNormRelu), 4);
  ASSERT_EQ(fused.count(OpKind::kBatchNormAddRelu), 3);
  ASSERT_EQ(fused.graph.ops.size(), eager.graph.ops.size() - 2 - 4 - (2 + 3 + 3));
  expect_same_step(fused, eager);
  const float initial_loss = eager.executor->loss(eager.ws);
  for (int step = 0; step < 20; ++step) {
    EXPECT_NEAR(fused.executor->loss(fused.ws), eager.executor->loss(eager.ws), 1e-4f) << step;
    for (ResnetRun* run : {&fused, &eager}) {
      float* values = run->params.flat_values().data();
      const float* grads = run->params.flat_grads().data();
      for (int64_t i = 0; i < run->params.num_trainable_floats(); ++i)
        values[i] -= 0.02f * grads[i];
      run->step();
    }
  }
  EXPECT_LT(fused.executor->loss(fused.ws), 0.85f * initial_loss) << "the trajectory is flat";
}

// max_ops 3: the downsampling blocks' BatchNormAddReluOp takes the separate shortcut BN's output
// as its identity summand.
TEST(ResnetPasses, MaxOpsThreeMatchesTheEagerOne) {
  ResnetRun fused(GraphMode::kTrain, only(make_bn_relu_pass()), with_max_ops(3));
  ResnetRun eager(GraphMode::kTrain, FusionPipeline{}, FusionOptions{});
  ASSERT_EQ(fused.count(OpKind::kBatchNormAddRelu), 3);
  ASSERT_EQ(fused.count(OpKind::kBatchNorm), 2);
  expect_same_step(fused, eager);
}

TEST(ResnetPasses, FusedEvalGraphMatchesTheEagerOne) {
  ResnetRun fused(GraphMode::kEval, resnet_passes(), padding_allowed());
  ResnetRun eager(GraphMode::kEval, FusionPipeline{}, FusionOptions{});
  ASSERT_EQ(fused.count(OpKind::kBatchNormInferenceRelu), 4);
  ASSERT_EQ(fused.count(OpKind::kConvShortcut), 2);
  fused.step();
  eager.step();
  EXPECT_LT(rel_diff(fused.ws.values[fused.graph.output], eager.ws.values[eager.graph.output]),
            kTolerance);
}

}  // namespace
}  // namespace ft
