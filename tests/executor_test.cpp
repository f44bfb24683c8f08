// Executor gradient bookkeeping: each activation gradient is zeroed just before its first writer,
// or handed over stale ("fresh") to an op that overwrites it (ReLU, BatchNorm, residual add,
// convolution on both the Winograd and oneDNN paths; the Linear family, the LM head and the fused
// GPT ops; in bf16, flash attention over the QKV GEMM's views). The default must give exactly the
// bits of the reference twin in which every gradient is zeroed up front and every op accumulates.
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

enum class GptGraph { kEager, kFused, kFusedBf16 };

// A small GPT (dropout on, so every GPT op kind is built), eager or after every fusion pass; in
// bf16, flash attention is handed q, k and v as fresh views of the QKV GEMM's output.
StepResult run_gpt_steps(GptGraph built, bool fresh_gradients) {
  const GptShape shape{2, 2, 32, 16, 64, 0.1f, false};
  constexpr int kBatch = 2;
  const bool fused = built != GptGraph::kEager;
  ParamStore params;
  Graph graph = build_gpt(shape, kBatch, params, GraphMode::kTrain,
                          built == GptGraph::kFusedBf16 ? DType::kBF16 : DType::kF32);
  if (built == GptGraph::kFusedBf16) params.enable_bf16_copies();
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

class GptFreshGradients : public ::testing::TestWithParam<GptGraph> {};

TEST_P(GptFreshGradients, MatchZeroedTwinBitForBit) {
  expect_same_bits(run_gpt_steps(GetParam(), true), run_gpt_steps(GetParam(), false));
}

std::string graph_name(const ::testing::TestParamInfo<GptGraph>& info) {
  switch (info.param) {
    case GptGraph::kEager:
      return "eager";
    case GptGraph::kFused:
      return "fused";
    case GptGraph::kFusedBf16:
      break;
  }
  return "fused_bf16";
}

INSTANTIATE_TEST_SUITE_P(Graphs, GptFreshGradients,
                         ::testing::Values(GptGraph::kEager, GptGraph::kFused,
                                           GptGraph::kFusedBf16),
                         graph_name);

// Reads views of one root and records, in backward, which of its inputs it was handed fresh;
// writes each fresh one whole (and nothing else).
class ViewReaderOp : public Op {
 public:
  explicit ViewReaderOp(bool overwrites_views) : overwrites_views_(overwrites_views) {}
  OpKind op_kind() const override { return OpKind::kOther; }
  bool supports_views() const override { return true; }
  bool overwrites_fresh_view_grads(const Workspace&) const override { return overwrites_views_; }
  void forward(Workspace& ws, ParamStore&) override { ws.values[outputs[0]].fill(0.0f); }
  void backward(Workspace& ws, ParamStore&) override {
    fresh.clear();
    for (ValueId id : inputs) fresh.push_back(ws.grad_is_fresh(id));
  }
  std::vector<bool> fresh;

 private:
  bool overwrites_views_;
};

// Which inputs of the reader of views of a [4, 6] root are handed out fresh: only when that one op
// reads the root, through views covering its columns once, and overwrites fresh views.
std::vector<bool> fresh_views(const std::vector<std::pair<int64_t, int64_t>>& columns,
                              bool overwrites_views, bool second_reader) {
  Graph graph;
  graph.input = graph.add_value("x", {4, 6});
  const ValueId root = graph.add_value("root", {4, 6});
  graph.add_op<ViewReaderOp>("produce", {graph.input}, {root}, {}, false);
  std::vector<ValueId> views;
  for (const auto& [offset, width] : columns)
    views.push_back(graph.add_view("view" + std::to_string(views.size()), root, offset, width));
  const ValueId out = graph.add_value("out", {1});
  ViewReaderOp& reader = graph.add_op<ViewReaderOp>("read", views, {out}, {}, overwrites_views);
  graph.output = graph.loss = out;
  if (second_reader) {
    graph.loss = graph.add_value("loss", {1});
    graph.add_op<ViewReaderOp>("also_read", std::vector<ValueId>{views[0], out},
                               std::vector<ValueId>{graph.loss}, std::vector<ParamId>{}, false);
  }
  ParamStore params;
  params.allocate();
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  executor.forward(ws);
  executor.backward(ws);
  return reader.fresh;
}

TEST(ExecutorFreshViews, OnlyTheSoleReaderOfViewsCoveringTheRootOnceGetsThemFresh) {
  EXPECT_EQ(fresh_views({{0, 2}, {2, 2}, {4, 2}}, true, false),
            (std::vector<bool>{true, true, true}));
  EXPECT_EQ(fresh_views({{4, 2}, {0, 4}}, true, false), (std::vector<bool>{true, true}));
  EXPECT_EQ(fresh_views({{0, 2}, {2, 2}, {4, 2}}, false, false),
            (std::vector<bool>{false, false, false}))
      << "the op does not overwrite views";
  EXPECT_EQ(fresh_views({{0, 2}, {4, 2}}, true, false), (std::vector<bool>{false, false}))
      << "columns 2 and 3 would keep stale values";
  EXPECT_EQ(fresh_views({{0, 2}, {2, 2}}, true, false), (std::vector<bool>{false, false}))
      << "columns 4 and 5 would keep stale values";
  EXPECT_EQ(fresh_views({{0, 4}, {2, 4}}, true, false), (std::vector<bool>{false, false}))
      << "columns 2 and 3 would be written twice";
  EXPECT_EQ(fresh_views({{0, 2}, {2, 2}, {4, 2}}, true, true),
            (std::vector<bool>{false, false, false}))
      << "another op adds into the first view";
}

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
