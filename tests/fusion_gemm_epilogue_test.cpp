// Tests for fusion.vertical.gemm_epilogue. LinearGeluOp runs against its unfused twin, LinearOp ->
// GeluOp, on the same random inputs and parameters through the Executor: forward output, loss,
// and the input, weight and bias gradients agree within 1e-5 of the largest, at row counts that
// are not a multiple of the tile, with a weight row offset, through a column view of x, and with
// every activation gradient NaN before backward (the op overwrites a fresh dx). The eval form
// (oneDNN's GELU post-op) matches the eager eval pair. Then the pass: it fuses the MLP's
// c_fc -> gelu of a GPT, and refuses a Linear whose output has a second reader, max_ops 1 and a
// tile_kb too small for one row, each with its reason.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "fusion/ops/gelu_rows_avx512.h"
#include "fusion/ops/linear_gelu.h"
#include "fusion/passes.h"
#include "model/gpt.h"
#include "model/graph_edit.h"
#include "model/ops/cast.h"
#include "model/ops/residual.h"
#include "tests/fusion_test_util.h"
#include "tests/op_test_util.h"

namespace ft {
namespace {

using fusion_test::max_abs;
using fusion_test::rel_diff;
using op_test::OpGraph;

struct Shape3 {
  int64_t rows, in, out;
};

struct TwinOptions {
  int64_t weight_row_offset = 0;
  int tile_rows = 8;
  int64_t x_columns_extra = 0;  // > 0: x is a column view inside a wider root
  GraphMode mode = GraphMode::kTrain;
  bool bf16 = false;  // x cast to bf16 first, bf16 weight copies (train.precision: bf16)
};

struct LinearGeluGraph {
  OpGraph g;
  ValueId x_root = -1, x = -1, y = -1;
  ParamId weight = -1, bias = -1;
};

// x [rows, in] -> rows [offset, offset + out) of a [offset + out + 3, in] weight -> GELU -> y.
void build(LinearGeluGraph& t, bool fused, const Shape3& s, const TwinOptions& o) {
  t.g.graph.mode = o.mode;
  t.x_root = t.g.input("x", {s.rows, s.in + o.x_columns_extra});
  t.x = o.x_columns_extra > 0 ? t.g.graph.add_view("x.view", t.x_root, 1, s.in) : t.x_root;
  if (o.bf16) {
    const ValueId x_bf16 = t.g.graph.add_value("x.bf16", {s.rows, s.in}, DType::kBF16);
    t.g.graph.add_op<CastOp>("x.cast", {t.x}, {x_bf16}, {}, s.rows, s.in);
    t.x = x_bf16;
    t.g.bf16_weight_copies = true;
  }
  t.weight = t.g.param("c_fc.weight", {o.weight_row_offset + s.out + 3, s.in}, 0.0f, 0.3f);
  t.bias = t.g.param("c_fc.bias", {o.weight_row_offset + s.out + 3}, 0.0f, 0.5f);
  t.y = t.g.value("gelu", {s.rows, s.out});
  if (fused) {
    t.g.op<LinearGeluOp>({t.x}, {t.y}, {t.weight, t.bias}, s.rows, s.in, s.out, true,
                         o.weight_row_offset, o.tile_rows,
                         o.mode == GraphMode::kTrain ? LinearGeluForward::kTiledKeepPreactivation
                                                     : LinearGeluForward::kGeluPostOp);
  } else {
    const ValueId pre = t.g.value("c_fc", {s.rows, s.out});
    t.g.graph.add_op<LinearOp>("c_fc", {t.x}, {pre}, {t.weight, t.bias}, s.rows, s.in, s.out, true,
                               o.weight_row_offset);
    t.g.graph.add_op<GeluOp>("gelu", {pre}, {t.y}, {}, s.rows * s.out);
  }
  t.g.finish(t.y);
}

void fill_grads_with_nan(Workspace& ws) {
  for (Tensor& grad : ws.grads)
    if (grad.defined()) grad.fill(std::numeric_limits<float>::quiet_NaN());
}

void step(OpGraph& g) {
  g.params.zero_grads();
  g.executor->forward(g.ws);
  fill_grads_with_nan(g.ws);
  g.executor->backward(g.ws);
}

void expect_twins_agree(const Shape3& s, const TwinOptions& o) {
  LinearGeluGraph unfused, fused;
  build(unfused, false, s, o);
  build(fused, true, s, o);
  step(unfused.g);
  step(fused.g);
  const float loss = unfused.g.executor->loss(unfused.g.ws);
  EXPECT_NEAR(fused.g.executor->loss(fused.g.ws), loss, 1e-5f * std::fabs(loss));
  EXPECT_LT(rel_diff(fused.g.ws.values[fused.y], unfused.g.ws.values[unfused.y]), 1e-5f);
  EXPECT_LT(rel_diff(fused.g.ws.grads[fused.x_root], unfused.g.ws.grads[unfused.x_root]), 1e-5f);
  for (ParamId id : {fused.weight, fused.bias}) {
    EXPECT_LT(rel_diff(fused.g.params[id].grad, unfused.g.params[id].grad), 1e-5f)
        << unfused.g.params[id].name;
    EXPECT_GT(max_abs(unfused.g.params[id].grad), 1e-3f) << unfused.g.params[id].name;
  }
  EXPECT_GT(max_abs(unfused.g.ws.grads[unfused.x_root]), 1e-3f);
}

TEST(LinearGeluOpTest, MatchesLinearThenGeluWhenRowsDoNotDivideIntoTiles) {
  expect_twins_agree({37, 24, 40}, {});
}

TEST(LinearGeluOpTest, MatchesAtAWeightRowOffset) {
  TwinOptions options;
  options.weight_row_offset = 5;  // rows outside [5, 5 + out) must keep a zero gradient
  expect_twins_agree({21, 16, 32}, options);
}

TEST(LinearGeluOpTest, MatchesWithXAColumnView) {
  TwinOptions options;
  options.x_columns_extra = 3;
  options.tile_rows = 5;
  expect_twins_agree({19, 16, 24}, options);
}

TEST(LinearGeluOpTest, MatchesAtGptTinyMlpShapeOnTwoThreads) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  TwinOptions options;
  options.tile_rows = 128;  // tile_kb 256 at out 512; 2 tiles, GELU loops take the OpenMP path
  expect_twins_agree({256, 128, 512}, options);
  omp_set_num_threads(threads);
}

TEST(LinearGeluOpTest, OneTileCoveringAllRowsMatches) {
  TwinOptions options;
  options.tile_rows = 1000;  // clamped to rows
  expect_twins_agree({13, 8, 16}, options);
}

// In bf16 backward computes, sums into db and rounds dpre in one sweep (no fp32 dpre); the twin
// rounds the GELU's fp32 gradient inside LinearOp's backward. Same values, same order: only the
// GEMMs' tiling may differ, far below a wrong db or an unrounded dpre.
TEST(LinearGeluOpTest, MatchesLinearThenGeluInBf16) {
  const int threads = omp_get_max_threads();
  for (int team : {1, 2}) {
    omp_set_num_threads(team);
    TwinOptions options;
    options.bf16 = true;
    options.tile_rows = 64;  // 64 x 256 elements: the sweep takes the OpenMP path
    expect_twins_agree({150, 32, 256}, options);
  }
  omp_set_num_threads(threads);
}

// The AVX512-BF16 row loops (fusion/ops/gelu_rows_avx512.h) against the generic ones: the same
// arithmetic in the same order, so the bf16 output, dx and every parameter gradient agree bit for
// bit. Rows of 100 columns run one four-vector step and leave a masked tail.
TEST(LinearGeluOpTest, Avx512RowLoopsMatchTheGenericOnesBitForBit) {
  if (!gelu_rows_avx512_enabled()) GTEST_SKIP() << "no AVX512-BF16 here (or capped by oneDNN)";
  TwinOptions options;
  options.bf16 = true;
  options.tile_rows = 16;
  LinearGeluGraph generic, avx512;
  set_gelu_rows_avx512_for_testing(false);
  build(generic, true, {40, 24, 100}, options);
  step(generic.g);
  set_gelu_rows_avx512_for_testing(true);
  build(avx512, true, {40, 24, 100}, options);
  step(avx512.g);
  EXPECT_EQ(avx512.g.executor->loss(avx512.g.ws), generic.g.executor->loss(generic.g.ws));
  EXPECT_EQ(avx512.g.ws.values[avx512.y].to_host_vector(),
            generic.g.ws.values[generic.y].to_host_vector());
  EXPECT_EQ(avx512.g.ws.grads[avx512.x_root].to_host_vector(),
            generic.g.ws.grads[generic.x_root].to_host_vector());
  for (ParamId id : {avx512.weight, avx512.bias}) {
    EXPECT_EQ(avx512.g.params[id].grad.to_host_vector(), generic.g.params[id].grad.to_host_vector())
        << generic.g.params[id].name;
    EXPECT_GT(max_abs(generic.g.params[id].grad), 1e-3f);
  }
}

// The forward's bf16 output (what fusion.vertical.cast makes it write) and the gelu'(pre) it keeps
// from the AVX-512 row loop against the generic one, over rows of 100 columns (a four-vector step
// and a masked tail).
TEST(LinearGeluOpTest, Avx512Bf16OutputMatchesTheGenericLoopBitForBit) {
  if (!gelu_rows_avx512_enabled()) GTEST_SKIP() << "no AVX512-BF16 here (or capped by oneDNN)";
  const int64_t rows = 9, in = 16, out = 100, tile = 4;
  Rng rng(3);
  std::vector<bf16_bits> x(rows * in), weight(out * in);
  for (bf16_bits& value : x) value = float_to_bf16(rng.normal());
  for (bf16_bits& value : weight) value = float_to_bf16(0.3f * rng.normal());
  std::vector<float> bias(out), pre_tile(tile * out);
  for (float& value : bias) value = rng.normal();
  std::vector<bf16_bits> generic(rows * out), avx512(rows * out);
  std::vector<float> generic_grad(rows * out), avx512_grad(rows * out);
  for (bool fast : {false, true}) {
    set_gelu_rows_avx512_for_testing(fast);
    linear_gelu_forward((fast ? avx512 : generic).data(),
                        (fast ? avx512_grad : generic_grad).data(), pre_tile.data(), x.data(),
                        weight.data(), bias.data(), rows, in, out, tile, 0, 0);
  }
  set_gelu_rows_avx512_for_testing(true);
  EXPECT_EQ(avx512, generic);
  EXPECT_EQ(avx512_grad, generic_grad);
  int negative = 0;  // GELU's negative lobe and positive side both show up
  for (bf16_bits value : generic) negative += bf16_to_float(value) < 0.0f;
  EXPECT_GT(negative, 0);
  EXPECT_LT(negative, rows * out);
}

// Forward keeps gelu'(pre) for backward: each kept value is gelu_tanh_grad of the eager Linear's
// output, and y is gelu_tanh of it.
TEST(LinearGeluOpTest, KeepsTheGeluDerivativeForBackward) {
  LinearGeluGraph unfused, fused;
  build(unfused, false, {9, 8, 12}, {});
  build(fused, true, {9, 8, 12}, {});
  unfused.g.forward();
  fused.g.forward();
  const auto& op = static_cast<const LinearGeluOp&>(*fused.g.op_under_test);
  ASSERT_EQ(op.saved_for_backward().numel(), 9 * 12);
  const ValueId pre_id = unfused.g.graph.ops.front()->outputs[0];
  const float* pre = unfused.g.ws.values[pre_id].data();
  for (int64_t i = 0; i < 9 * 12; ++i) {
    EXPECT_NEAR(op.saved_for_backward().data()[i], gelu_tanh_grad(pre[i]), 1e-5f) << i;
    EXPECT_NEAR(fused.g.ws.values[fused.y].data()[i], gelu_tanh(pre[i]), 1e-5f) << i;
  }
}

TEST(LinearGeluOpTest, GeluPostOpMatchesTheEagerEvalPair) {
  TwinOptions options;
  options.mode = GraphMode::kEval;
  options.weight_row_offset = 2;
  LinearGeluGraph unfused, fused;
  build(unfused, false, {30, 16, 48}, options);
  build(fused, true, {30, 16, 48}, options);
  unfused.g.forward();
  fused.g.forward();
  // oneDNN evaluates tanh exactly where core/math/gelu_math.h uses a polynomial exp: a few ulp
  // apart.
  EXPECT_LT(rel_diff(fused.g.ws.values[fused.y], unfused.g.ws.values[unfused.y]), 1e-5f);
  EXPECT_GT(max_abs(unfused.g.ws.values[unfused.y]), 1e-1f);
  Op& op = *fused.g.op_under_test;
  EXPECT_THROW(op.backward(fused.g.ws, fused.g.params), Error);
}

TEST(LinearGeluOpTest, GradientsMatchFiniteDifferences) {
  LinearGeluGraph fused;
  TwinOptions options;
  options.tile_rows = 2;
  options.weight_row_offset = 1;
  build(fused, true, {5, 4, 6}, options);
  op_test::expect_gradients_match(fused.g, op_test::kSmoothTolerance);
}

// ---- the pass ----

struct PassRun {
  std::vector<FusionDecision> decisions;
  int fused = 0;
};

PassRun run_pass(Graph& graph, const ParamStore& params, const FusionOptions& options) {
  PassRun run;
  PassContext context{options, params, run.decisions};
  run.fused = make_gemm_epilogue_pass()->apply(graph, context);
  validate(graph);
  return run;
}

int count_kind(const Graph& graph, OpKind kind) {
  return static_cast<int>(std::count_if(graph.ops.begin(), graph.ops.end(),
                                        [&](const auto& op) { return op->op_kind() == kind; }));
}

// x -> c_fc -> gelu -> c_proj -> loss; with `second_reader`, c_fc's output is also added to a
// residual, so the pre-activation must stay a buffer.
struct MlpGraph {
  ParamStore params;
  Graph graph;
};

void build_mlp(MlpGraph& m, bool second_reader, int64_t rows = 6, int64_t C = 8) {
  const ParamId fc_w = m.params.add("c_fc.weight", {4 * C, C}, ParamInit::kZeros, 0, true);
  const ParamId fc_b = m.params.add("c_fc.bias", {4 * C}, ParamInit::kZeros, 0, true);
  const ParamId proj_w = m.params.add("c_proj.weight", {C, 4 * C}, ParamInit::kZeros, 0, true);
  m.params.allocate();
  Graph& g = m.graph;
  const ValueId x = g.add_value("x", {rows, C});
  g.input = x;
  const ValueId pre = g.add_value("c_fc", {rows, 4 * C});
  const ValueId act = g.add_value("gelu", {rows, 4 * C});
  g.add_op<LinearOp>("mlp.c_fc", {x}, {pre}, {fc_w, fc_b}, rows, C, 4 * C, true);
  g.add_op<GeluOp>("mlp.gelu", {pre}, {act}, {}, rows * 4 * C);
  ValueId last = act;
  if (second_reader) {
    last = g.add_value("sum", {rows, 4 * C});
    g.add_op<ResidualAddOp>("sum", {act, pre}, {last}, {}, rows * 4 * C);
  }
  const ValueId out = g.add_value("c_proj", {rows, C});
  g.add_op<LinearOp>("mlp.c_proj", {last}, {out}, {proj_w}, rows, 4 * C, C, false);
  g.output = out;
  add_weighted_sum_loss(g, out, 3);
}

TEST(GemmEpiloguePassTest, FusesLinearThenGeluAndNothingElse) {
  MlpGraph m;
  build_mlp(m, false);
  const PassRun run = run_pass(m.graph, m.params, FusionOptions());
  EXPECT_EQ(run.fused, 1);
  ASSERT_EQ(run.decisions.size(), 1u);  // c_proj feeds no GELU: not a candidate
  EXPECT_TRUE(run.decisions[0].fused);
  EXPECT_EQ(run.decisions[0].site, "mlp.c_fc");
  EXPECT_EQ(run.decisions[0].ops_absorbed, 2);
  ASSERT_EQ(m.graph.ops.size(), 3u);
  EXPECT_EQ(m.graph.ops[0]->op_kind(), OpKind::kLinearGelu);
  EXPECT_EQ(m.graph.ops[0]->eager_ops, 2);
  EXPECT_EQ(m.graph.ops[1]->op_kind(), OpKind::kLinear);
  const auto& op = static_cast<const LinearGeluOp&>(*m.graph.ops[0]);
  EXPECT_EQ(op.forward_kind(), LinearGeluForward::kTiledKeepPreactivation);
  EXPECT_EQ(op.tile_rows(), 6);  // 1024 KiB / (4 · 32) = 8192 rows, clamped to the 6 there are
}

TEST(GemmEpiloguePassTest, RefusesAnOutputWithTwoConsumers) {
  MlpGraph m;
  build_mlp(m, true);
  const PassRun run = run_pass(m.graph, m.params, FusionOptions());
  EXPECT_EQ(run.fused, 0);
  ASSERT_EQ(run.decisions.size(), 1u);
  EXPECT_FALSE(run.decisions[0].fused);
  EXPECT_EQ(run.decisions[0].reason, "output has 2 consumers");
  EXPECT_EQ(count_kind(m.graph, OpKind::kLinearGelu), 0);
}

TEST(GemmEpiloguePassTest, RespectsMaxOps) {
  MlpGraph m;
  build_mlp(m, false);
  FusionOptions options;
  options.max_ops = 1;
  const PassRun run = run_pass(m.graph, m.params, options);
  EXPECT_EQ(run.fused, 0);
  ASSERT_EQ(run.decisions.size(), 1u);
  EXPECT_EQ(run.decisions[0].reason, "max_ops 1");
  options.max_ops = 2;
  EXPECT_EQ(run_pass(m.graph, m.params, options).fused, 1);
}

TEST(GemmEpiloguePassTest, TileKbSetsTileRowsAndRefusesARowThatCannotFit) {
  MlpGraph m;
  build_mlp(m, false, 300, 128);  // out 512: one row of pre-activation is 2 KiB
  FusionOptions options;
  options.tile_kb = 1;
  PassRun run = run_pass(m.graph, m.params, options);
  EXPECT_EQ(run.fused, 0);
  ASSERT_EQ(run.decisions.size(), 1u);
  EXPECT_EQ(run.decisions[0].reason, "row of 2 KiB exceeds tile_kb 1");
  options.tile_kb = 9;  // 9 KiB / 2 KiB: 4 whole rows
  run = run_pass(m.graph, m.params, options);
  ASSERT_EQ(run.fused, 1);
  EXPECT_EQ(static_cast<const LinearGeluOp&>(*m.graph.ops[0]).tile_rows(), 4);
}

TEST(GemmEpiloguePassTest, FusesEveryMlpOfAGptAndUsesThePostOpInEval) {
  const GptShape shape{3, 2, 16, 8, 256, 0.1f, false};
  for (GraphMode mode : {GraphMode::kTrain, GraphMode::kEval}) {
    ParamStore params;
    Graph graph = build_gpt(shape, 2, params, mode);
    params.allocate();
    const PassRun run = run_pass(graph, params, FusionOptions());
    EXPECT_EQ(run.fused, shape.n_layer) << graph_mode_name(mode);
    EXPECT_EQ(run.decisions.size(), static_cast<size_t>(shape.n_layer));
    EXPECT_EQ(count_kind(graph, OpKind::kGelu), 0);
    EXPECT_EQ(count_kind(graph, OpKind::kLinearGelu), shape.n_layer);
    for (const auto& op : graph.ops) {
      if (op->op_kind() != OpKind::kLinearGelu) continue;
      EXPECT_EQ(static_cast<const LinearGeluOp&>(*op).forward_kind(),
                mode == GraphMode::kTrain ? LinearGeluForward::kTiledKeepPreactivation
                                          : LinearGeluForward::kGeluPostOp);
    }
  }
}

TEST(LinearGeluOpTest, CostCountsTheGemmsAndTheSavedPreactivation) {
  Graph graph;
  const ValueId x = graph.add_value("x", {10, 4});
  const ValueId y = graph.add_value("y", {10, 6});
  auto& op = graph.add_op<LinearGeluOp>("fused", {x}, {y}, {0, 1}, 10, 4, 6, true, 0, 4);
  const OpCost cost = op.cost(graph);
  EXPECT_DOUBLE_EQ(cost.forward_flops, 2.0 * 10 * 4 * 6 + 20.0 * 10 * 6);
  EXPECT_DOUBLE_EQ(cost.backward_flops, 4.0 * 10 * 4 * 6 + 30.0 * 10 * 6);
  EXPECT_DOUBLE_EQ(cost.saved_bytes, 4.0 * 10 * 6);
  EXPECT_DOUBLE_EQ(cost.bytes_read, 4.0 * (10 * 4 + 6 * 4 + 6));
  EXPECT_DOUBLE_EQ(cost.bytes_written, 4.0 * 2 * 10 * 6);
}

}  // namespace
}  // namespace ft
