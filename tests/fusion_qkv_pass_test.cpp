// Tests for what fusion.horizontal.qkv and fusion.horizontal.batched_layernorm refuse, on small
// hand-built graphs: Linears over row blocks that are not contiguous, over different inputs,
// whose outputs are a graph result or read by an op without views; dependent LayerNorms. Each
// refusal must carry its reason; what is fused must keep the loss and every gradient.
#include <algorithm>
#include <string>
#include <vector>

#include "core/rng.h"
#include "fusion/ops/qkv_linear.h"
#include "fusion/passes.h"
#include "fusion/pipeline.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/layernorm.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"
#include "tests/fusion_qkv_util.h"

namespace ft {
namespace {

using namespace fusion_test;

// x -> two Linears over row blocks `offset_a` and `offset_b` (in units of C) of one [4C, C]
// weight -> a, b; the second reads `x2` instead of x when `second_input`. The outputs feed a
// LayerNorm each (which reads views) unless `residual_reads_outputs`, when a ResidualAdd (which
// does not) reads them directly.
struct TwoLinears {
  ParamStore params;
  Graph graph;
};

void build_two_linears(TwoLinears& t, int offset_a, int offset_b, bool second_input,
                       bool residual_reads_outputs) {
  const int64_t rows = 4, C = 8;
  const ParamId weight = t.params.add("c_attn.weight", {4 * C, C}, ParamInit::kNormal, 0.3f, true);
  const ParamId bias = t.params.add("c_attn.bias", {4 * C}, ParamInit::kZeros, 0.0f, false);
  const ParamId ln_w = t.params.add("ln.weight", {C}, ParamInit::kOnes, 0.0f, false);
  const ParamId ln_b = t.params.add("ln.bias", {C}, ParamInit::kZeros, 0.0f, false);
  t.params.allocate();
  t.params.initialize(1);
  Graph& g = t.graph;
  const ValueId x = g.add_value("x", {rows, C});
  g.input = x;
  ValueId x2 = x;
  if (second_input) {
    x2 = g.add_value("x2", {rows, C});
    g.add_op<LayerNormOp>("ln_x2", {x}, {x2}, {ln_w, ln_b}, rows, C);
  }
  const ValueId a = g.add_value("attn.a", {rows, C});
  const ValueId b = g.add_value("attn.b", {rows, C});
  g.add_op<LinearOp>("attn.a", {x}, {a}, {weight, bias}, rows, C, C, true, offset_a * C);
  g.add_op<LinearOp>("attn.b", {x2}, {b}, {weight, bias}, rows, C, C, true, offset_b * C);
  ValueId sum_a = a, sum_b = b;
  if (!residual_reads_outputs) {
    sum_a = g.add_value("ln_a", {rows, C});
    sum_b = g.add_value("ln_b", {rows, C});
    g.add_op<LayerNormOp>("ln_a", {a}, {sum_a}, {ln_w, ln_b}, rows, C);
    g.add_op<LayerNormOp>("ln_b", {b}, {sum_b}, {ln_w, ln_b}, rows, C);
  }
  const ValueId sum = g.add_value("sum", {rows, C});
  g.add_op<ResidualAddOp>("sum", {sum_a, sum_b}, {sum}, {}, rows * C);
  g.output = sum;
  add_weighted_sum_loss(g, sum, 7);
}

struct PassOutcome {
  int qkv_ops = 0;
  std::vector<FusionDecision> decisions;
};

PassOutcome run_qkv_pass(int offset_a, int offset_b, bool second_input, bool residual) {
  TwoLinears t;
  build_two_linears(t, offset_a, offset_b, second_input, residual);
  FusionPipeline pipeline;
  pipeline.add(make_qkv_pass());
  PassOutcome outcome;
  outcome.decisions = pipeline.run(t.graph, t.params, FusionOptions()).decisions;
  outcome.qkv_ops = count_kind(t.graph, OpKind::kQkvLinear);
  return outcome;
}

bool any_reason_contains(const PassOutcome& outcome, const std::string& text) {
  return std::any_of(outcome.decisions.begin(), outcome.decisions.end(),
                     [&](const FusionDecision& d) {
                       return !d.fused && d.reason.find(text) != std::string::npos;
                     });
}

// Loss and parameter gradients of one step of a TwoLinears graph.
StepResult run_two_linears(TwoLinears& t) {
  Executor executor(t.graph, t.params);
  Workspace ws = executor.make_workspace();
  Rng rng(4);
  Tensor& x = ws.values[t.graph.input];
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = rng.normal();
  t.params.zero_grads();
  executor.forward(ws);
  executor.backward(ws);
  StepResult result;
  result.loss = executor.loss(ws);
  for (ParamId id = 0; id < t.params.size(); ++id)
    result.grads.emplace_back(t.params[id].grad.data(),
                              t.params[id].grad.data() + t.params[id].grad.numel());
  return result;
}

TEST(QkvPassTest, FusesContiguousRowBlocksInEitherOpOrder) {
  for (int offset_a : {0, 2}) {  // offset_a 2: b's block comes first in the weight
    SCOPED_TRACE("offset_a " + std::to_string(offset_a));
    TwoLinears unfused, fused;
    build_two_linears(unfused, offset_a, 1, false, false);
    build_two_linears(fused, offset_a, 1, false, false);
    FusionPipeline pipeline;
    pipeline.add(make_qkv_pass());
    pipeline.run(fused.graph, fused.params, FusionOptions());
    ASSERT_EQ(count_kind(fused.graph, OpKind::kQkvLinear), 1);
    const Op& gemm = *fused.graph.ops[0];
    EXPECT_EQ(static_cast<const QkvLinearOp&>(gemm).weight_row_offset(), std::min(offset_a, 1) * 8);
    const StepResult expected = run_two_linears(unfused);
    expect_same_step(run_two_linears(fused), expected, unfused.params);
  }
}

TEST(QkvPassTest, RefusesRowBlocksThatAreNotContiguous) {
  const PassOutcome outcome = run_qkv_pass(0, 2, false, false);
  EXPECT_EQ(outcome.qkv_ops, 0);
  EXPECT_TRUE(any_reason_contains(outcome, "not contiguous"));
  EXPECT_EQ(outcome.decisions.size(), 2u);
}

TEST(QkvPassTest, RefusesLinearsOverDifferentInputs) {
  const PassOutcome outcome = run_qkv_pass(0, 1, true, false);
  EXPECT_EQ(outcome.qkv_ops, 0);
  EXPECT_TRUE(any_reason_contains(outcome, "inputs differ"));
}

TEST(QkvPassTest, RefusesOutputsReadByAnOpWithoutViews) {
  const PassOutcome outcome = run_qkv_pass(0, 1, false, true);
  EXPECT_EQ(outcome.qkv_ops, 0);
  EXPECT_TRUE(any_reason_contains(outcome, "does not support views"));
}

TEST(QkvPassTest, RefusesAGraphResult) {
  TwoLinears t;
  build_two_linears(t, 0, 1, false, false);
  for (ValueId id = 0; id < static_cast<ValueId>(t.graph.values.size()); ++id)
    if (t.graph.values[id].name == "attn.a") t.graph.output = id;
  FusionPipeline pipeline;
  pipeline.add(make_qkv_pass());
  PassOutcome outcome;
  outcome.decisions = pipeline.run(t.graph, t.params, FusionOptions()).decisions;
  EXPECT_EQ(count_kind(t.graph, OpKind::kQkvLinear), 0);
  EXPECT_TRUE(any_reason_contains(outcome, "'attn.a' is a graph result"));
  EXPECT_TRUE(any_reason_contains(outcome, "neighbours cannot be fused"));
}

TEST(BatchedLayerNormPassTest, LeavesDependentLayerNormsApart) {
  // ln_a and ln_b are consecutive and independent.
  TwoLinears t;
  build_two_linears(t, 0, 2, false, false);
  FusionPipeline pipeline;
  pipeline.add(make_batched_layernorm_pass());
  pipeline.run(t.graph, t.params, FusionOptions());
  EXPECT_EQ(count_kind(t.graph, OpKind::kBatchedLayerNorm), 1);

  // Two consecutive LayerNorms where the second reads the first's output: no candidate.
  Graph chain;
  ParamStore params;
  const ParamId w = params.add("w", {8}, ParamInit::kOnes, 0.0f, false);
  const ParamId b = params.add("b", {8}, ParamInit::kZeros, 0.0f, false);
  params.allocate();
  const ValueId x = chain.add_value("x", {4, 8});
  chain.input = x;
  const ValueId y = chain.add_value("y", {4, 8});
  const ValueId z = chain.add_value("z", {4, 8});
  chain.add_op<LayerNormOp>("ln_y", {x}, {y}, {w, b}, 4, 8);
  chain.add_op<LayerNormOp>("ln_z", {y}, {z}, {w, b}, 4, 8);
  chain.output = z;
  add_weighted_sum_loss(chain, z, 1);
  pipeline.run(chain, params, FusionOptions());
  EXPECT_EQ(count_kind(chain, OpKind::kBatchedLayerNorm), 0);
  EXPECT_EQ(count_kind(chain, OpKind::kLayerNorm), 2);
}

}  // namespace
}  // namespace ft
