// Executor gradient bookkeeping: each activation gradient is zeroed just before its first writer,
// or handed over stale ("fresh") to an op that overwrites it (ReLU, BatchNorm, residual add,
// convolution on both the Winograd and oneDNN paths; the Linear family, the LM head and the fused
// GPT ops). The default must give exactly the bits of the reference twin in which every gradient
// is zeroed up front and every op accumulates.
#include "model/executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "fusion/pipeline.h"
#include "model/gpt.h"
#include "model/resnet.h"

namespace ft {
namespace {

struct StepResult {
  std::vector<float> losses;
  std::vector<float> param_grads;  // after the last step
};

// Two forward+backward steps of `graph` on the batch `fill` stages. Activation gradients start
// as NaN, so an op that claims to overwrite a fresh gradient but misses an element poisons the
// result.
StepResult run_two_steps(const Graph& graph, ParamStore& params, bool fresh_gradients,
                         const std::function<void(Workspace&)>& fill) {
  Executor executor(graph, params);
  executor.set_fresh_gradients(fresh_gradients);
  Workspace ws = executor.make_workspace();
  for (Tensor& grad : ws.grads) grad.fill(std::numeric_limits<float>::quiet_NaN());
  fill(ws);
  StepResult result;
  for (int step = 0; step < 2; ++step) {
    params.zero_grads();
    executor.forward(ws);
    executor.backward(ws);
    result.losses.push_back(executor.loss(ws));
  }
  const Tensor& grads = params.flat_grads();
  result.param_grads.assign(grads.data(), grads.data() + grads.numel());
  return result;
}

void expect_same_bits(const StepResult& fresh, const StepResult& zeroed) {
  EXPECT_EQ(fresh.losses, zeroed.losses);
  ASSERT_EQ(fresh.param_grads.size(), zeroed.param_grads.size());
  int nan_count = 0;
  for (float grad : fresh.param_grads) nan_count += std::isnan(grad);
  EXPECT_EQ(nan_count, 0);
  EXPECT_EQ(fresh.param_grads, zeroed.param_grads);
}

// resnet8 at `width`, batch 4.
StepResult run_steps(int width, bool fresh_gradients) {
  ResnetShape shape{1, width};
  ParamStore params;
  Graph graph = build_resnet(shape, 4, params);
  params.allocate();
  params.initialize(7);
  return run_two_steps(graph, params, fresh_gradients, [&](Workspace& ws) {
    Rng rng(8);
    Tensor& images = ws.values[graph.input];
    for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = rng.normal();
    for (int b = 0; b < 4; ++b) ws.targets.push_back(static_cast<int32_t>(rng.below(10)));
  });
}

class FreshGradients : public ::testing::TestWithParam<int> {};

TEST_P(FreshGradients, MatchZeroedTwinBitForBit) {
  expect_same_bits(run_steps(GetParam(), true), run_steps(GetParam(), false));
}

// Width 16 runs the 3x3 "same" convolutions on Winograd; width 4 keeps every convolution on
// oneDNN (direct and transposed), whose backward data then writes straight into the gradient.
INSTANTIATE_TEST_SUITE_P(Widths, FreshGradients, ::testing::Values(16, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "width" + std::to_string(info.param);
                         });

// A small GPT (dropout on, so every GPT op kind is built), eager or after every fusion pass.
StepResult run_gpt_steps(bool fused, bool fresh_gradients) {
  const GptShape shape{2, 2, 32, 16, 64, 0.1f, false};
  constexpr int kBatch = 2;
  ParamStore params;
  Graph graph = build_gpt(shape, kBatch, params);
  params.allocate();
  params.initialize(5);
  FusionOptions options;
  options.enabled = fused;
  FusionPipeline::standard().run(graph, params, options);
  return run_two_steps(graph, params, fresh_gradients, [&](Workspace& ws) {
    Rng rng(6);
    for (int i = 0; i < kBatch * shape.seq_len; ++i) {
      ws.tokens.push_back(static_cast<int32_t>(rng.below(shape.vocab_size)));
      ws.targets.push_back(static_cast<int32_t>(rng.below(shape.vocab_size)));
    }
    ws.dropout_seed = 9;
  });
}

class GptFreshGradients : public ::testing::TestWithParam<bool> {};

TEST_P(GptFreshGradients, MatchZeroedTwinBitForBit) {
  expect_same_bits(run_gpt_steps(GetParam(), true), run_gpt_steps(GetParam(), false));
}

INSTANTIATE_TEST_SUITE_P(Graphs, GptFreshGradients, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("fused") : std::string("eager");
                         });

// Counts the executor's stage() and forward() calls of one op.
class StageCountingOp : public Op {
 public:
  OpKind op_kind() const override { return OpKind::kRelu; }
  void stage(Workspace&, ParamStore&) override { ++stages; }
  void forward(Workspace&, ParamStore&) override { ++forwards; }
  void backward(Workspace&, ParamStore&) override {}
  int stages = 0, forwards = 0;
};

// A CUDA-graph step stages its batch before the replay, and the captured forward must not stage
// it again: forward stages only when stage_inputs has not run since the last forward.
TEST(ExecutorStaging, ForwardStagesItsBatchUnlessStagedSinceTheLastForward) {
  Graph graph;
  graph.mode = GraphMode::kEval;
  graph.input = graph.add_value("x", {2, 4});
  graph.output = graph.loss = graph.add_value("y", {1});
  StageCountingOp& op = graph.add_op<StageCountingOp>("count", {graph.input}, {graph.loss}, {});
  ParamStore params;
  params.allocate();
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  executor.forward(ws);
  EXPECT_EQ(op.stages, 1);
  executor.stage_inputs(ws);
  executor.forward(ws);
  EXPECT_EQ(op.stages, 2) << "a staged batch was staged again by forward";
  EXPECT_FALSE(ws.inputs_staged);
  executor.forward(ws);
  EXPECT_EQ(op.stages, 3) << "the next forward must stage its own batch";
  EXPECT_EQ(op.forwards, 3);
}

}  // namespace
}  // namespace ft
