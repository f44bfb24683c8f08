// The graph IR the fusion passes stand on: the verifier rejects each kind of broken graph, dead
// values are dropped with ids renumbered, views re-root, and gradients flow through column views
// (read and written) as a finite-difference check confirms.
#include "model/graph_edit.h"

#include <gtest/gtest.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/gelu.h"
#include "model/ops/linear.h"
#include "model/ops/residual.h"

namespace ft {
namespace {

constexpr int64_t kRows = 5, kIn = 6, kWidth = 4;

// A weight [rows_out, kIn] and bias the test graphs' Linears use row ranges of.
struct Weights {
  ParamId weight, bias;
};

Weights add_weights(ParamStore& params, int64_t out_rows) {
  return {params.add("w", {out_rows, kIn}, ParamInit::kNormal, 0.5f, true),
          params.add("b", {out_rows}, ParamInit::kNormal, 0.5f, false)};
}

std::string validation_error(const Graph& graph) {
  try {
    validate(graph);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Validate, RejectsReadBeforeWrite) {
  ParamStore params;
  const Weights w = add_weights(params, kWidth);
  Graph graph;
  graph.input = graph.add_value("x", {kRows, kIn});
  const ValueId orphan = graph.add_value("orphan", {kRows, kIn});
  const ValueId y = graph.add_value("y", {kRows, kWidth});
  graph.add_op<LinearOp>("linear", {orphan}, {y}, {w.weight, w.bias}, kRows, kIn, kWidth, true);
  graph.output = y;
  graph.loss = add_weighted_sum_loss(graph, y, 1);
  EXPECT_NE(validation_error(graph).find("reads 'orphan' before any op writes it"),
            std::string::npos)
      << validation_error(graph);
  graph.ops[0]->inputs = {graph.input};
  EXPECT_EQ(validation_error(graph), "");
}

TEST(Validate, RejectsTwoWritersAndViewsOnOpsWithoutViewSupport) {
  ParamStore params;
  const Weights w = add_weights(params, kWidth);
  Graph graph;
  graph.input = graph.add_value("x", {kRows, kIn});
  const ValueId y = graph.add_value("y", {kRows, kWidth});
  graph.add_op<LinearOp>("first", {graph.input}, {y}, {w.weight, w.bias}, kRows, kIn, kWidth, true);
  graph.add_op<LinearOp>("second", {graph.input}, {y}, {w.weight, w.bias}, kRows, kIn, kWidth,
                         true);
  graph.output = y;
  graph.loss = add_weighted_sum_loss(graph, y, 1);
  EXPECT_NE(validation_error(graph).find("written by both 'first' and 'second'"),
            std::string::npos);

  Graph viewed;
  viewed.input = viewed.add_value("x", {kRows, kIn});
  const ValueId column = viewed.add_view("x.column", viewed.input, 2, 3);
  const ValueId activated = viewed.add_value("gelu", {kRows, 3});
  viewed.add_op<GeluOp>("gelu", {column}, {activated}, {}, kRows * 3);
  viewed.output = activated;
  viewed.loss = add_weighted_sum_loss(viewed, activated, 1);
  EXPECT_NE(validation_error(viewed).find("does not support views"), std::string::npos);
}

TEST(GraphEdit, RemoveDeadValuesRenumbersOps) {
  ParamStore params;
  const Weights w = add_weights(params, kWidth);
  Graph graph;
  graph.input = graph.add_value("x", {kRows, kIn});
  graph.add_value("dead", {7});
  const ValueId y = graph.add_value("y", {kRows, kWidth});
  graph.add_op<LinearOp>("linear", {graph.input}, {y}, {w.weight, w.bias}, kRows, kIn, kWidth,
                         true);
  graph.output = y;
  graph.loss = add_weighted_sum_loss(graph, y, 1);
  ASSERT_EQ(remove_dead_values(graph), 1);
  EXPECT_EQ(graph.values.size(), 3u);
  EXPECT_EQ(graph.values[graph.ops[0]->outputs[0]].name, "y");
  EXPECT_EQ(graph.values[graph.output].name, "y");
  EXPECT_EQ(validation_error(graph), "");
}

TEST(GraphEdit, MakeViewReRootsExistingViews) {
  Graph graph;
  const ValueId wide = graph.add_value("wide", {kRows, 3 * kWidth});
  const ValueId q = graph.add_value("q", {kRows, kWidth});
  const ValueId head = graph.add_view("q.head1", q, 2, 2);
  make_view(graph, q, wide, kWidth);
  EXPECT_EQ(graph.values[q].view_of, wide);
  EXPECT_EQ(graph.values[head].view_of, wide);
  EXPECT_EQ(graph.values[head].column_offset, kWidth + 2);
  EXPECT_EQ(graph.row_stride(head), 3 * kWidth);
  EXPECT_THROW(make_view(graph, head, wide, 0), Error);  // already a view
}

TEST(GraphEdit, ReplaceOpSetKeepsTheLastPosition) {
  ParamStore params;
  const Weights w = add_weights(params, kWidth);
  Graph graph;
  graph.input = graph.add_value("x", {kRows, kIn});
  for (const char* name : {"a", "b", "c"}) {
    const ValueId out = graph.add_value(name, {kRows, kWidth});
    graph.add_op<LinearOp>(name, {graph.input}, {out}, {w.weight, w.bias}, kRows, kIn, kWidth,
                           true);
  }
  auto replacement = std::make_unique<LinearOp>(kRows, kIn, kWidth, true);
  replacement->name = "merged";
  replace_op_set(graph, {2, 0}, std::move(replacement));
  ASSERT_EQ(graph.ops.size(), 2u);
  EXPECT_EQ(graph.ops[0]->name, "b");
  EXPECT_EQ(graph.ops[1]->name, "merged");
}

// Two Linears write the column halves of one root, which a third Linear reads whole; two more
// read its halves as views and are summed. Every parameter gradient passes a finite-difference
// check, so views are read and written at the right stride and the shared root gradient is
// zeroed once per backward.
TEST(Views, GradientsFlowThroughColumnViews) {
  ParamStore params;
  const Weights w = add_weights(params, 2 * kWidth);
  const ParamId mix = params.add("mix", {kWidth, 2 * kWidth}, ParamInit::kNormal, 0.5f, true);
  Graph graph;
  graph.input = graph.add_value("x", {kRows, kIn});
  const ValueId wide = graph.add_value("wide", {kRows, 2 * kWidth});
  const ValueId left = graph.add_view("wide.left", wide, 0, kWidth);
  const ValueId right = graph.add_view("wide.right", wide, kWidth, kWidth);
  graph.add_op<LinearOp>("left", {graph.input}, {left}, {w.weight, w.bias}, kRows, kIn, kWidth,
                         true, 0);
  graph.add_op<LinearOp>("right", {graph.input}, {right}, {w.weight, w.bias}, kRows, kIn, kWidth,
                         true, kWidth);
  const ValueId mixed = graph.add_value("mixed", {kRows, kWidth});
  graph.add_op<LinearOp>("mix", {wide}, {mixed}, {mix}, kRows, 2 * kWidth, kWidth, false);
  const ValueId left_again = graph.add_value("left_again", {kRows, kWidth});
  graph.add_op<LinearOp>("left_again", {left}, {left_again}, {mix}, kRows, kWidth, kWidth, false);
  const ValueId sum = graph.add_value("sum", {kRows, kWidth});
  graph.add_op<ResidualAddOp>("sum", {mixed, left_again}, {sum}, {}, kRows * kWidth);
  graph.output = sum;
  graph.loss = add_weighted_sum_loss(graph, sum, 3);
  ASSERT_EQ(validation_error(graph), "");
  params.allocate();
  params.initialize(4);
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  Rng rng(2);
  for (int64_t i = 0; i < kRows * kIn; ++i) ws.values[graph.input].data()[i] = rng.normal();
  for (int repeat = 0; repeat < 2; ++repeat) {  // a second backward sees a re-zeroed root
    params.zero_grads();
    const GradcheckReport report = gradcheck(graph, params, ws, {});
    EXPECT_LT(report.max_rel_error, 3e-3f) << report.worst;
    EXPECT_GT(report.max_abs_grad, 1e-2f);
  }
}

TEST(Executor, EvalGraphsHaveNoBackwardAndNoGradientBuffers) {
  ParamStore params;
  const Weights w = add_weights(params, kWidth);
  Graph graph;
  graph.mode = GraphMode::kEval;
  graph.input = graph.add_value("x", {kRows, kIn});
  const ValueId y = graph.add_value("y", {kRows, kWidth});
  graph.add_op<LinearOp>("linear", {graph.input}, {y}, {w.weight, w.bias}, kRows, kIn, kWidth,
                         true);
  graph.output = y;
  graph.loss = add_weighted_sum_loss(graph, y, 1);
  params.allocate();
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  for (const Tensor& grad : ws.grads) EXPECT_EQ(grad.numel(), 0);
  executor.forward(ws);
  EXPECT_THROW(executor.backward(ws), Error);
}

}  // namespace
}  // namespace ft
