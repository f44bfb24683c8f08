// Tests for fusion.vertical.residual_layernorm. ResidualLayerNormOp runs against its unfused
// twin, DropoutOp -> ResidualAddOp -> LayerNormOp, on the same random inputs and parameters
// through the Executor, with the residual sum read a second time downstream (as the next
// residual add reads the stream); input gradients are NaN-filled where the op may overwrite
// them. Then the pass runs on a small GPT, with and without dropout and in an eval graph, and
// must keep the loss and every gradient, absorb what it should, split at max_ops and refuse the
// rest with a reason.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fusion/ops/residual_layernorm.h"
#include "fusion/passes.h"
#include "fusion/pipeline.h"
#include "model/gpt.h"
#include "model/graph_edit.h"
#include "tests/fusion_test_util.h"
#include "tests/op_test_util.h"

namespace ft {
namespace {

using fusion_test::max_abs;
using fusion_test::rel_diff;
using op_test::OpGraph;

constexpr uint64_t kSalt = 0x5eed5a17ull;
constexpr uint64_t kSeed = 1234;

// residual_in x and branch b -> sum s = x + dropout(b), normed n = LN(s); then y = s + n, a
// second reader of both outputs, under the weighted-sum loss.
struct ChainGraph {
  OpGraph g;
  ValueId x = -1, b = -1, sum = -1, normed = -1;
  ParamId weight = -1, bias = -1;
  Op* dropout = nullptr;
};

void build_chain(ChainGraph& c, bool fused, int64_t rows, int64_t C, float p, int tile_rows = 16) {
  c.x = c.g.input("residual_in", {rows, C});
  c.b = c.g.input("branch", {rows, C});
  c.weight = c.g.param("ln.weight", {C}, 1.0f, 0.3f);
  c.bias = c.g.param("ln.bias", {C}, 0.0f, 0.3f);
  c.sum = c.g.value("sum", {rows, C});
  c.normed = c.g.value("normed", {rows, C});
  if (fused) {
    c.g.op<ResidualLayerNormOp>({c.x, c.b}, {c.sum, c.normed}, {c.weight, c.bias}, rows, C, p,
                                kSalt, tile_rows);
  } else {
    ValueId branch = c.b;
    if (p > 0.0f) {
      branch = c.g.value("dropped", {rows, C});
      c.dropout = &c.g.graph.add_op<DropoutOp>("dropout", {c.b}, {branch}, {}, rows * C, p, kSalt);
    }
    c.g.graph.add_op<ResidualAddOp>("residual", {c.x, branch}, {c.sum}, {}, rows * C);
    c.g.graph.add_op<LayerNormOp>("ln", {c.sum}, {c.normed}, {c.weight, c.bias}, rows, C);
  }
  const ValueId y = c.g.value("next_residual", {rows, C});
  c.g.graph.add_op<ResidualAddOp>("next_residual", {c.sum, c.normed}, {y}, {}, rows * C);
  c.g.finish(y);
  c.g.ws.dropout_seed = kSeed;
}

// Forward and backward; with `nan_fill`, the op's input gradients start as NaN (the executor
// hands them over fresh, and an op that overwrites must write every element).
void run_step(ChainGraph& c, bool nan_fill) {
  c.g.params.zero_grads();
  c.g.executor->forward(c.g.ws);
  if (nan_fill)
    for (ValueId id : {c.x, c.b}) c.g.ws.grads[id].fill(std::numeric_limits<float>::quiet_NaN());
  c.g.executor->backward(c.g.ws);
}

void expect_twins_agree(int64_t rows, int64_t C, float p, bool fresh, int tile_rows = 16) {
  ChainGraph unfused, fused;
  build_chain(unfused, false, rows, C, p);
  build_chain(fused, true, rows, C, p, tile_rows);
  fused.g.executor->set_fresh_gradients(fresh);
  run_step(unfused, false);
  run_step(fused, fresh);
  const Workspace& u = unfused.g.ws;
  const Workspace& f = fused.g.ws;
  EXPECT_LT(rel_diff(f.values[fused.sum], u.values[unfused.sum]), 1e-6f);
  EXPECT_LT(rel_diff(f.values[fused.normed], u.values[unfused.normed]), 1e-5f);
  EXPECT_LT(rel_diff(f.grads[fused.x], u.grads[unfused.x]), 1e-5f) << "d residual_in";
  EXPECT_LT(rel_diff(f.grads[fused.b], u.grads[unfused.b]), 1e-5f) << "d branch";
  EXPECT_LT(rel_diff(fused.g.params[fused.weight].grad, unfused.g.params[unfused.weight].grad),
            1e-5f);
  EXPECT_LT(rel_diff(fused.g.params[fused.bias].grad, unfused.g.params[unfused.bias].grad), 1e-5f);
  EXPECT_GT(max_abs(u.grads[unfused.x]), 1e-3f);
  EXPECT_GT(max_abs(unfused.g.params[unfused.weight].grad), 1e-3f);
  if (p > 0.0f) {
    const auto& op = static_cast<const ResidualLayerNormOp&>(*fused.g.op_under_test);
    const auto& dropout = static_cast<const DropoutOp&>(*unfused.dropout);
    EXPECT_TRUE(op.keep_mask() == dropout.keep_mask()) << "masks differ from DropoutOp's";
  }
}

TEST(ResidualLayerNormOpTest, MatchesChainWithDropoutOverwritingFreshGradients) {
  expect_twins_agree(37, 24, 0.3f, true);
}

TEST(ResidualLayerNormOpTest, MatchesChainWithDropoutAccumulating) {
  expect_twins_agree(37, 24, 0.3f, false);
}

TEST(ResidualLayerNormOpTest, MatchesChainWithoutDropout) {
  expect_twins_agree(37, 24, 0.0f, true);
  expect_twins_agree(37, 24, 0.0f, false);
}

TEST(ResidualLayerNormOpTest, MatchesChainAtGptTinyShapeOnTwoThreads) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  expect_twins_agree(512, 128, 0.1f, true, 85);
  omp_set_num_threads(threads);
}

TEST(ResidualLayerNormOpTest, BitsDoNotDependOnTheThreadCount) {
  std::vector<std::vector<float>> runs;
  const int threads = omp_get_max_threads();
  for (int n : {1, 2}) {
    omp_set_num_threads(n);
    ChainGraph c;
    build_chain(c, true, 512, 128, 0.1f, 40);
    run_step(c, true);
    std::vector<float> bits;
    for (const Tensor* t : {&c.g.ws.values[c.normed], &c.g.ws.grads[c.b],
                            &c.g.params[c.weight].grad, &c.g.params[c.bias].grad})
      bits.insert(bits.end(), t->data(), t->data() + t->numel());
    runs.push_back(bits);
  }
  omp_set_num_threads(threads);
  EXPECT_TRUE(runs[0] == runs[1]);
}

TEST(ResidualLayerNormOpTest, GradientsMatchFiniteDifferences) {
  ChainGraph c;
  build_chain(c, true, 3, 6, 0.25f, 2);
  op_test::expect_gradients_match(c.g, op_test::kSmoothTolerance);
}

// ---- the pass on a small GPT ----

const GptShape kShape{2, 2, 32, 16, 256, 0.0f, false};
constexpr int kBatch = 2;

FusionOptions only_residual_layernorm(int max_ops = 4) {
  FusionOptions options;
  options.vertical = {false, true, false, false, false};
  options.horizontal.qkv = options.horizontal.batched_layernorm = false;
  options.horizontal.multi_tensor = options.horizontal.conv_shortcut = false;
  options.max_ops = max_ops;
  return options;
}

struct PassRun {
  FusionResult result;
  Graph graph;
  float loss = 0;
  std::vector<float> grads;
};

int count_kind(const Graph& graph, OpKind kind) {
  return static_cast<int>(std::count_if(graph.ops.begin(), graph.ops.end(),
                                        [&](const auto& op) { return op->op_kind() == kind; }));
}

std::vector<const FusionDecision*> decisions(const FusionResult& result, bool fused) {
  std::vector<const FusionDecision*> picked;
  for (const FusionDecision& decision : result.decisions)
    if (decision.pass == "residual_layernorm" && decision.fused == fused)
      picked.push_back(&decision);
  return picked;
}

PassRun run_gpt(float dropout, const FusionOptions& options, GraphMode mode = GraphMode::kTrain) {
  GptShape shape = kShape;
  shape.dropout = dropout;
  ParamStore params;
  const GptParamIds ids = register_gpt_params(shape, params);
  params.allocate();
  params.initialize(9);
  PassRun run;
  run.graph = build_gpt_graph(shape, kBatch, ids, mode);
  run.result = FusionPipeline::standard().run(run.graph, params, options);
  Executor executor(run.graph, params);
  Workspace ws = executor.make_workspace();
  Rng rng(4);
  for (int i = 0; i < kBatch * shape.seq_len; ++i) {
    ws.tokens.push_back(static_cast<int32_t>(rng.next_u64() % 256));
    ws.targets.push_back(static_cast<int32_t>(rng.next_u64() % 256));
  }
  ws.dropout_seed = 77;
  params.zero_grads();
  executor.forward(ws);
  run.loss = executor.loss(ws);
  if (mode == GraphMode::kTrain) {
    executor.backward(ws);
    const Tensor& grads = params.flat_grads();
    run.grads.assign(grads.data(), grads.data() + grads.numel());
  }
  return run;
}

void expect_same_step(const PassRun& fused, const PassRun& eager) {
  EXPECT_NEAR(fused.loss, eager.loss, 1e-5f * std::fabs(eager.loss));
  ASSERT_EQ(fused.grads.size(), eager.grads.size());
  float largest = 0, worst = 0;
  for (size_t i = 0; i < eager.grads.size(); ++i) {
    largest = std::max(largest, std::fabs(eager.grads[i]));
    const float error = std::fabs(fused.grads[i] - eager.grads[i]);
    worst = std::isnan(error) || error > worst ? error : worst;
  }
  EXPECT_LE(worst, 1e-5f * largest);
}

TEST(ResidualLayerNormPassTest, FusesEveryResidualWithItsLayerNormAndDropout) {
  FusionOptions off;
  off.enabled = false;
  const PassRun eager = run_gpt(0.2f, off);
  const PassRun fused = run_gpt(0.2f, only_residual_layernorm());
  // residual_1 -> ln_2 and residual_2 -> ln_1 of the next block (or ln_f), each with its dropout.
  const auto done = decisions(fused.result, true);
  ASSERT_EQ(done.size(), 2u * kShape.n_layer);
  for (const FusionDecision* decision : done) EXPECT_EQ(decision->ops_absorbed, 3);
  EXPECT_EQ(count_kind(fused.graph, OpKind::kResidualLayerNorm), 2 * kShape.n_layer);
  EXPECT_EQ(count_kind(fused.graph, OpKind::kResidualAdd), 0);
  EXPECT_EQ(count_kind(fused.graph, OpKind::kDropout), 1);    // the embedding's: two readers
  EXPECT_EQ(count_kind(fused.graph, OpKind::kLayerNorm), 1);  // h.0.ln_1
  for (const auto& op : fused.graph.ops)
    if (op->op_kind() == OpKind::kResidualLayerNorm) {
      EXPECT_EQ(op->eager_ops, 3);
    }
  // ln_1 of block 0 reads the embedding dropout, not a residual sum: skipped with its reason.
  const auto skipped = decisions(fused.result, false);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0]->site, "h.0.ln_1");
  EXPECT_NE(skipped[0]->reason.find("dropout"), std::string::npos) << skipped[0]->reason;
  expect_same_step(fused, eager);
}

TEST(ResidualLayerNormPassTest, FusesResidualAndLayerNormWithoutDropout) {
  FusionOptions off;
  off.enabled = false;
  const PassRun eager = run_gpt(0.0f, off);
  const PassRun fused = run_gpt(0.0f, only_residual_layernorm());
  const auto done = decisions(fused.result, true);
  ASSERT_EQ(done.size(), 2u * kShape.n_layer);
  for (const FusionDecision* decision : done) EXPECT_EQ(decision->ops_absorbed, 2);
  const auto skipped = decisions(fused.result, false);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0]->reason.find("embedding"), std::string::npos) << skipped[0]->reason;
  expect_same_step(fused, eager);
}

TEST(ResidualLayerNormPassTest, EvalGraphFusesResidualAndLayerNorm) {
  FusionOptions off;
  off.enabled = false;
  const PassRun eager = run_gpt(0.2f, off, GraphMode::kEval);
  const PassRun fused = run_gpt(0.2f, only_residual_layernorm(), GraphMode::kEval);
  EXPECT_EQ(count_kind(fused.graph, OpKind::kResidualLayerNorm), 2 * kShape.n_layer);
  for (const FusionDecision* decision : decisions(fused.result, true))
    EXPECT_EQ(decision->ops_absorbed, 2);
  EXPECT_NEAR(fused.loss, eager.loss, 1e-5f * std::fabs(eager.loss));
}

TEST(ResidualLayerNormPassTest, MaxOpsTwoLeavesTheDropout) {
  FusionOptions off;
  off.enabled = false;
  const PassRun eager = run_gpt(0.2f, off);
  const PassRun fused = run_gpt(0.2f, only_residual_layernorm(2));
  const auto done = decisions(fused.result, true);
  ASSERT_EQ(done.size(), 2u * kShape.n_layer);
  for (const FusionDecision* decision : done) {
    EXPECT_EQ(decision->ops_absorbed, 2);
    EXPECT_NE(decision->reason.find("max_ops 2"), std::string::npos) << decision->reason;
  }
  EXPECT_EQ(count_kind(fused.graph, OpKind::kDropout), 1 + 2 * kShape.n_layer);
  for (const auto& op : fused.graph.ops)
    if (op->op_kind() == OpKind::kResidualLayerNorm) {
      EXPECT_EQ(op->eager_ops, 2);
    }
  expect_same_step(fused, eager);
}

TEST(ResidualLayerNormPassTest, MaxOpsOneFusesNothing) {
  const PassRun fused = run_gpt(0.2f, only_residual_layernorm(1));
  EXPECT_EQ(count_kind(fused.graph, OpKind::kResidualLayerNorm), 0);
  const auto skipped = decisions(fused.result, false);
  EXPECT_EQ(skipped.size(), 1u + 2 * kShape.n_layer);
  int max_ops_reasons = 0;
  for (const FusionDecision* decision : skipped) max_ops_reasons += decision->reason == "max_ops 1";
  EXPECT_EQ(max_ops_reasons, 2 * kShape.n_layer);
}

TEST(ResidualLayerNormPassTest, TileBudgetTooSmallForOneRowRefuses) {
  FusionOptions options = only_residual_layernorm();
  options.tile_kb = 0;
  const PassRun fused = run_gpt(0.0f, options);
  EXPECT_EQ(count_kind(fused.graph, OpKind::kResidualLayerNorm), 0);
  for (const FusionDecision* decision : decisions(fused.result, false))
    if (decision->site != "h.0.ln_1") {
      EXPECT_NE(decision->reason.find("tile_kb 0"), std::string::npos) << decision->reason;
    }
}

// A hand-built graph: a dropout with two readers (not absorbed), a residual add nothing
// normalises, and an op reading a sum before its LayerNorm.
TEST(ResidualLayerNormPassTest, RefusesWhatItCannotFuse) {
  const int64_t rows = 4, C = 8;
  ParamStore params;
  const ParamId weight = params.add("ln.weight", {C}, ParamInit::kOnes, 0, false);
  const ParamId bias = params.add("ln.bias", {C}, ParamInit::kZeros, 0, false);
  params.allocate();
  Graph graph;
  auto value = [&](const char* name) { return graph.add_value(name, {rows, C}); };
  const ValueId x = value("x");
  graph.input = x;
  const ValueId dropped = value("dropped"), a = value("a"), normed_a = value("normed_a");
  const ValueId b = value("b"), c = value("c"), early = value("early"),
                normed_c = value("normed_c");
  graph.add_op<DropoutOp>("dropout", {x}, {dropped}, {}, rows * C, 0.1f, kSalt);
  graph.add_op<ResidualAddOp>("add_a", {x, dropped}, {a}, {}, rows * C);
  graph.add_op<LayerNormOp>("ln_a", {a}, {normed_a}, {weight, bias}, rows, C);
  graph.add_op<ResidualAddOp>("add_b", {normed_a, dropped}, {b}, {}, rows * C);
  graph.add_op<ResidualAddOp>("add_c", {b, a}, {c}, {}, rows * C);
  graph.add_op<ResidualAddOp>("early_reader", {c, b}, {early}, {}, rows * C);
  graph.add_op<LayerNormOp>("ln_c", {c}, {normed_c}, {weight, bias}, rows, C);
  const ValueId last = value("last");
  graph.add_op<ResidualAddOp>("last", {early, normed_c}, {last}, {}, rows * C);
  graph.output = last;
  add_weighted_sum_loss(graph, last, 3);
  const FusionResult result =
      FusionPipeline::standard().run(graph, params, only_residual_layernorm());
  const auto done = decisions(result, true);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->site, "add_a");
  EXPECT_EQ(done[0]->ops_absorbed, 2) << "a dropout read twice was absorbed";
  const auto skipped = decisions(result, false);
  ASSERT_EQ(skipped.size(), 4u);
  std::vector<std::string> sites, reasons;
  for (const FusionDecision* decision : skipped) {
    sites.push_back(decision->site);
    reasons.push_back(decision->reason);
  }
  EXPECT_EQ(sites, (std::vector<std::string>{"add_b", "add_c", "early_reader", "last"}));
  EXPECT_NE(reasons[0].find("no LayerNorm reads 'b'"), std::string::npos) << reasons[0];
  EXPECT_NE(reasons[1].find("'early_reader' reads the sum before"), std::string::npos)
      << reasons[1];
  EXPECT_EQ(count_kind(graph, OpKind::kResidualLayerNorm), 1);
  EXPECT_EQ(count_kind(graph, OpKind::kDropout), 1);
}

}  // namespace
}  // namespace ft
