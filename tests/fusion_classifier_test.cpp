// Tests for fusion.vertical.classifier. ClassifierOp runs against its unfused twin, TiedLmHeadOp
// -> SoftmaxCrossEntropyOp, on the same random inputs, wte and targets through the Executor:
// logits, loss, and the x and wte gradients agree within 1e-5 of the largest, at row counts that
// are not a multiple of the block and with every activation gradient NaN before backward (the
// op overwrites a fresh dx). The eval form computes the same logits and loss and saves nothing.
// Then the pass: it fuses a GPT's LM head and cross-entropy in train and eval graphs, leaves the
// ResNet's fc -> loss alone, and refuses logits with a second reader, max_ops 1 and a tile_kb too
// small for one row of logits, each with its reason.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fusion/ops/classifier.h"
#include "fusion/passes.h"
#include "model/gpt.h"
#include "model/graph_edit.h"
#include "model/resnet.h"
#include "tests/fusion_test_util.h"
#include "tests/op_test_util.h"

namespace ft {
namespace {

using fusion_test::max_abs;
using fusion_test::rel_diff;
using op_test::OpGraph;

struct ClassifierShape {
  int64_t rows, channels, vocab;
};

struct ClassifierGraph {
  OpGraph g;
  ValueId x = -1, logits = -1, loss = -1;
  ParamId wte = -1;
  ClassifierOp* fused_op = nullptr;
};

void build(ClassifierGraph& t, bool fused, const ClassifierShape& s, int tile_rows,
           GraphMode mode = GraphMode::kTrain) {
  t.g.graph.mode = mode;
  t.x = t.g.input("ln_f", {s.rows, s.channels});
  t.wte = t.g.param("wte", {s.vocab, s.channels}, 0.0f, 0.5f);
  t.logits = t.g.value("logits", {s.rows, s.vocab});
  t.loss = t.g.value("loss", {1});
  if (fused) {
    t.fused_op = &t.g.op<ClassifierOp>(
        {t.x}, {t.logits, t.loss}, {t.wte}, s.rows, s.channels, s.vocab, tile_rows,
        mode == GraphMode::kTrain ? ClassifierForward::kLossAndDlogits
                                  : ClassifierForward::kLossOnly);
  } else {
    t.g.graph.add_op<TiedLmHeadOp>("lm_head", {t.x}, {t.logits}, {t.wte}, s.rows, s.channels,
                                   s.vocab);
    t.g.graph.add_op<SoftmaxCrossEntropyOp>("cross_entropy", {t.logits}, {t.loss}, {}, s.rows,
                                            s.vocab);
  }
  t.g.graph.output = t.logits;
  t.g.finish(-1, t.loss);
  Rng rng(17);
  t.g.ws.targets.resize(s.rows);
  for (int32_t& target : t.g.ws.targets)
    target = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(s.vocab));
}

void step(OpGraph& g) {
  g.params.zero_grads();
  g.executor->forward(g.ws);
  for (Tensor& grad : g.ws.grads)
    if (grad.defined()) grad.fill(std::numeric_limits<float>::quiet_NaN());
  g.executor->backward(g.ws);
}

void expect_twins_agree(const ClassifierShape& s, int tile_rows) {
  ClassifierGraph unfused, fused;
  build(unfused, false, s, tile_rows);
  build(fused, true, s, tile_rows);
  step(unfused.g);
  step(fused.g);
  const float loss = unfused.g.executor->loss(unfused.g.ws);
  EXPECT_GT(loss, 0.1f);
  EXPECT_NEAR(fused.g.executor->loss(fused.g.ws), loss, 1e-5f * loss);
  EXPECT_LT(rel_diff(fused.g.ws.values[fused.logits], unfused.g.ws.values[unfused.logits]), 1e-5f);
  EXPECT_LT(rel_diff(fused.g.ws.grads[fused.x], unfused.g.ws.grads[unfused.x]), 1e-5f);
  EXPECT_LT(rel_diff(fused.g.params[fused.wte].grad, unfused.g.params[unfused.wte].grad), 1e-5f);
  EXPECT_GT(max_abs(unfused.g.ws.grads[unfused.x]), 1e-4f);
  EXPECT_GT(max_abs(unfused.g.params[unfused.wte].grad), 1e-4f);
}

TEST(ClassifierOpTest, MatchesLmHeadThenCrossEntropyWhenRowsDoNotDivideIntoBlocks) {
  expect_twins_agree({37, 16, 50}, 8);
}

TEST(ClassifierOpTest, MatchesWithOneBlockForAllRows) {
  expect_twins_agree({11, 8, 20}, 64);
}

TEST(ClassifierOpTest, MatchesAtGptTinyShapeOnTwoThreads) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  expect_twins_agree({256, 128, 256}, 256);
  expect_twins_agree({256, 128, 256}, 100);
  omp_set_num_threads(threads);
}

TEST(ClassifierOpTest, SavesDlogitsThatSumToZeroPerRow) {
  ClassifierGraph fused;
  build(fused, true, {9, 8, 12}, 4);
  fused.g.forward();
  const Tensor& dlogits = fused.fused_op->dlogits();
  ASSERT_EQ(dlogits.numel(), 9 * 12);
  for (int64_t row = 0; row < 9; ++row) {
    double sum = 0.0;
    for (int64_t c = 0; c < 12; ++c) sum += dlogits.data()[row * 12 + c];
    EXPECT_NEAR(sum, 0.0, 1e-7) << "row " << row;  // (softmax - onehot) / rows sums to 0
    EXPECT_LT(dlogits.data()[row * 12 + fused.g.ws.targets[row]], 0.0f);
  }
}

TEST(ClassifierOpTest, ScalesByTheIncomingLossGradient) {
  ClassifierGraph fused;
  build(fused, true, {7, 8, 10}, 3);
  step(fused.g);
  Tensor dwte_at_one = Tensor::empty(fused.g.params[fused.wte].grad.shape());
  dwte_at_one.copy_from(fused.g.params[fused.wte].grad);
  fused.g.params.zero_grads();
  fused.g.ws.grads[fused.x].fill(0.0f);
  fused.g.ws.grads[fused.loss].fill(2.5f);
  fused.fused_op->backward(fused.g.ws, fused.g.params);
  const Tensor& dwte = fused.g.params[fused.wte].grad;
  for (int64_t i = 0; i < dwte.numel(); ++i)
    EXPECT_NEAR(dwte.data()[i], 2.5f * dwte_at_one.data()[i], 1e-6f);
}

TEST(ClassifierOpTest, LossOnlyFormMatchesTheEagerEvalPair) {
  ClassifierGraph unfused, fused;
  build(unfused, false, {23, 16, 40}, 6, GraphMode::kEval);
  build(fused, true, {23, 16, 40}, 6, GraphMode::kEval);
  unfused.g.forward();
  fused.g.forward();
  const float loss = unfused.g.executor->loss(unfused.g.ws);
  EXPECT_NEAR(fused.g.executor->loss(fused.g.ws), loss, 1e-5f * loss);
  EXPECT_LT(rel_diff(fused.g.ws.values[fused.logits], unfused.g.ws.values[unfused.logits]), 1e-5f);
  EXPECT_EQ(fused.fused_op->dlogits().numel(), 0);
  EXPECT_THROW(fused.fused_op->backward(fused.g.ws, fused.g.params), Error);
}

TEST(ClassifierOpTest, GradientsMatchFiniteDifferences) {
  ClassifierGraph fused;
  build(fused, true, {5, 4, 7}, 2);
  op_test::expect_gradients_match(fused.g, op_test::kSmoothTolerance, 1e-3f);
}

TEST(ClassifierOpTest, CostAndLogitsPathMemory) {
  Graph graph;
  const ValueId x = graph.add_value("x", {10, 4});
  const ValueId logits = graph.add_value("logits", {10, 6});
  const ValueId loss = graph.add_value("loss", {1});
  auto& op = graph.add_op<ClassifierOp>("fused", {x}, {logits, loss}, {0}, 10, 4, 6, 3);
  const OpCost cost = op.cost(graph);
  EXPECT_DOUBLE_EQ(cost.forward_flops, 2.0 * 10 * 4 * 6 + 7.0 * 10 * 6);
  EXPECT_DOUBLE_EQ(cost.backward_flops, 4.0 * 10 * 4 * 6);
  EXPECT_DOUBLE_EQ(cost.saved_bytes, 4.0 * 10 * 6);  // dlogits, in place of the probabilities
  EXPECT_DOUBLE_EQ(classifier_logits_path_bytes(10, 6, false, GraphMode::kTrain), 3 * 240.0);
  EXPECT_DOUBLE_EQ(classifier_logits_path_bytes(10, 6, true, GraphMode::kTrain), 2 * 240.0);
  EXPECT_DOUBLE_EQ(classifier_logits_path_bytes(10, 6, true, GraphMode::kEval), 240.0);
}

// ---- the pass ----

struct PassRun {
  std::vector<FusionDecision> decisions;
  int fused = 0;
};

PassRun run_pass(Graph& graph, const ParamStore& params, const FusionOptions& options) {
  PassRun run;
  PassContext context{options, params, run.decisions};
  run.fused = make_classifier_pass()->apply(graph, context);
  validate(graph);
  return run;
}

const GptShape kGpt{2, 2, 16, 8, 256, 0.0f, false};

TEST(ClassifierPassTest, FusesTheGptLmHeadInTrainAndEvalGraphs) {
  for (GraphMode mode : {GraphMode::kTrain, GraphMode::kEval}) {
    ParamStore params;
    Graph graph = build_gpt(kGpt, 3, params, mode);
    const size_t ops_before = graph.ops.size();
    const PassRun run = run_pass(graph, params, FusionOptions());
    ASSERT_EQ(run.fused, 1) << graph_mode_name(mode);
    ASSERT_EQ(run.decisions.size(), 1u);
    EXPECT_TRUE(run.decisions[0].fused);
    EXPECT_EQ(run.decisions[0].site, "lm_head");
    EXPECT_EQ(graph.ops.size(), ops_before - 1);
    const Op& last = *graph.ops.back();
    ASSERT_EQ(last.op_kind(), OpKind::kClassifier);
    EXPECT_EQ(last.eager_ops, 2);
    EXPECT_EQ(last.outputs, (std::vector<ValueId>{graph.output, graph.loss}));
    const auto& classifier = static_cast<const ClassifierOp&>(last);
    EXPECT_EQ(classifier.forward_kind(), mode == GraphMode::kTrain
                                             ? ClassifierForward::kLossAndDlogits
                                             : ClassifierForward::kLossOnly);
    EXPECT_EQ(classifier.tile_rows(), 3 * 8);  // 1024 KiB holds 1024 rows of 1 KiB; 24 exist
    EXPECT_FALSE(graph.values[graph.output].needs_grad);
  }
}

TEST(ClassifierPassTest, LeavesTheResnetFcAloneWithAReason) {
  ParamStore params;
  Graph graph = build_resnet(ResnetShape{1, 4}, 2, params);
  const size_t ops_before = graph.ops.size();
  const PassRun run = run_pass(graph, params, FusionOptions());
  EXPECT_EQ(run.fused, 0);
  ASSERT_EQ(run.decisions.size(), 1u);
  EXPECT_EQ(run.decisions[0].reason,
            "logits come from linear 'fc'; only the tied LM head is fused");
  EXPECT_EQ(graph.ops.size(), ops_before);
}

// x -> lm_head -> logits -> cross_entropy, and with `second_reader` logits also feed a loss of
// their own, whose gradient the fused op could not pass on.
Graph classifier_chain(ParamStore& params, bool second_reader) {
  const ParamId wte = params.add("wte", {32, 8}, ParamInit::kZeros, 0, true);
  Graph graph;
  const ValueId x = graph.add_value("x", {4, 8});
  graph.input = x;
  graph.output = graph.add_value("logits", {4, 32});
  graph.loss = graph.add_value("loss", {1});
  graph.add_op<TiedLmHeadOp>("lm_head", {x}, {graph.output}, {wte}, 4, 8, 32);
  if (second_reader) {
    const ValueId copy = graph.add_value("logits.gelu", {4, 32});
    graph.add_op<GeluOp>("logits.gelu", {graph.output}, {copy}, {}, 4 * 32);
  }
  graph.add_op<SoftmaxCrossEntropyOp>("cross_entropy", {graph.output}, {graph.loss}, {}, 4, 32);
  return graph;
}

TEST(ClassifierPassTest, RefusesLogitsWithASecondConsumer) {
  ParamStore params;
  Graph graph = classifier_chain(params, true);
  const PassRun run = run_pass(graph, params, FusionOptions());
  EXPECT_EQ(run.fused, 0);
  ASSERT_EQ(run.decisions.size(), 1u);
  EXPECT_EQ(run.decisions[0].reason, "logits have 2 consumers");
}

TEST(ClassifierPassTest, RespectsMaxOpsAndTileKb) {
  ParamStore params;
  Graph graph = classifier_chain(params, false);
  FusionOptions options;
  options.max_ops = 1;
  PassRun run = run_pass(graph, params, options);
  EXPECT_EQ(run.fused, 0);
  ASSERT_EQ(run.decisions.size(), 1u);
  EXPECT_EQ(run.decisions[0].reason, "max_ops 1");

  Graph wide;
  const ValueId x = wide.add_value("x", {4, 8});
  wide.input = x;
  wide.output = wide.add_value("logits", {4, 512});  // 2 KiB of logits per row
  wide.loss = wide.add_value("loss", {1});
  const ParamId wte = params.add("wide.wte", {512, 8}, ParamInit::kZeros, 0, true);
  wide.add_op<TiedLmHeadOp>("lm_head", {x}, {wide.output}, {wte}, 4, 8, 512);
  wide.add_op<SoftmaxCrossEntropyOp>("cross_entropy", {wide.output}, {wide.loss}, {}, 4, 512);
  options.max_ops = 4;
  options.tile_kb = 1;
  run = run_pass(wide, params, options);
  EXPECT_EQ(run.fused, 0);
  ASSERT_EQ(run.decisions.size(), 1u);
  EXPECT_EQ(run.decisions[0].reason, "row of 2 KiB exceeds tile_kb 1");
  options.tile_kb = 5;  // two whole rows
  run = run_pass(wide, params, options);
  ASSERT_EQ(run.fused, 1);
  EXPECT_EQ(static_cast<const ClassifierOp&>(*wide.ops.back()).tile_rows(), 2);
}

}  // namespace
}  // namespace ft
