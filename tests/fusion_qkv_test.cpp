// Tests for the horizontal fusions fusion.horizontal.qkv and fusion.horizontal.batched_layernorm.
// Each fused op runs against its unfused twin on the same random inputs and parameters through
// the Executor (QkvLinearOp against three LinearOps over row blocks of one weight, and
// BatchedLayerNormOp against per-head LayerNormOps over column views with shared parameters);
// then the passes run on a small GPT, with and without qk_norm, and must keep the loss and every
// parameter gradient and respect max_ops. Refusals: tests/fusion_qkv_pass_test.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fusion/ops/batched_layernorm.h"
#include "fusion/ops/qkv_linear.h"
#include "fusion/passes.h"
#include "fusion/pipeline.h"
#include "model/gpt.h"
#include "model/graph_edit.h"
#include "model/ops/cast.h"
#include "model/ops/linear.h"
#include "tests/fusion_qkv_util.h"
#include "tests/op_test_util.h"

namespace ft {
namespace {

using namespace fusion_test;
using op_test::OpGraph;

void run_step(OpGraph& g) {
  g.params.zero_grads();
  g.executor->forward(g.ws);
  g.executor->backward(g.ws);
}

// ---- QkvLinearOp against three LinearOps ----

struct QkvGraph {
  OpGraph g;
  ValueId x = -1, y = -1;
  ParamId weight = -1, bias = -1;
};

// x [rows, C] through rows [first_block·C, (first_block + 3)·C) of a [blocks·C, C] weight into
// y [rows, 3C]: the unfused form writes y through three column views, one Linear each.
void build_qkv(QkvGraph& q, bool fused, int64_t rows, int64_t C, int blocks, int first_block) {
  q.x = q.g.input("x", {rows, C});
  q.weight = q.g.param("c_attn.weight", {blocks * C, C}, 0.0f, 0.3f);
  q.bias = q.g.param("c_attn.bias", {blocks * C}, 0.0f, 0.3f);
  q.y = q.g.value("qkv", {rows, 3 * C});
  if (fused) {
    q.g.op<QkvLinearOp>({q.x}, {q.y}, {q.weight, q.bias}, rows, C, C, 3, true, first_block * C);
  } else {
    for (int part = 0; part < 3; ++part) {
      const std::string name = std::string("attn.") + "qkv"[part];
      const ValueId view = q.g.graph.add_view(name, q.y, part * C, C);
      q.g.graph.add_op<LinearOp>(name, {q.x}, {view}, {q.weight, q.bias}, rows, C, C, true,
                                 (first_block + part) * C);
    }
  }
  q.g.finish(q.y);
}

void expect_qkv_twins_agree(int64_t rows, int64_t C, int blocks, int first_block) {
  QkvGraph unfused, fused;
  build_qkv(unfused, false, rows, C, blocks, first_block);
  build_qkv(fused, true, rows, C, blocks, first_block);
  run_step(unfused.g);
  run_step(fused.g);
  EXPECT_LT(rel_diff(fused.g.ws.values[fused.y], unfused.g.ws.values[unfused.y]), 1e-5f);
  EXPECT_LT(rel_diff(fused.g.ws.grads[fused.x], unfused.g.ws.grads[unfused.x]), 1e-5f);
  EXPECT_LT(rel_diff(fused.g.params[fused.weight].grad, unfused.g.params[unfused.weight].grad),
            1e-5f);
  EXPECT_LT(rel_diff(fused.g.params[fused.bias].grad, unfused.g.params[unfused.bias].grad), 1e-5f);
  EXPECT_GT(max_abs(unfused.g.ws.grads[unfused.x]), 1e-3f);
  EXPECT_GT(max_abs(unfused.g.params[unfused.weight].grad), 1e-3f);
}

TEST(QkvLinearOpTest, MatchesThreeLinearsOverRowBlocksOfOneWeight) {
  expect_qkv_twins_agree(24, 16, 3, 0);
}

TEST(QkvLinearOpTest, MatchesThreeLinearsAtAWeightRowOffset) {
  // Rows [C, 4C) of a [5C, C] weight: the offset reaches the weight, its gradient and the bias.
  expect_qkv_twins_agree(24, 16, 5, 1);
}

TEST(QkvLinearOpTest, MatchesThreeLinearsAtGptTinyShape) {
  expect_qkv_twins_agree(512, 128, 3, 0);
}

// In bf16 QkvLinearOp's backward rounds dy and sums db in one sweep; its twin here is one LinearOp
// over the same 3C weight rows (the same GEMM shapes), which rounds dy and sums db in two. Same
// values in the same order: bit for bit, on one thread and on two (columns split over threads).
TEST(QkvLinearOpTest, Bf16BackwardMatchesOneLinearBitForBit) {
  const int threads = omp_get_max_threads();
  for (int team : {1, 2}) {
    omp_set_num_threads(team);
    const int64_t rows = 96, C = 256;  // 96 x 768 elements: the sweep takes the OpenMP path
    QkvGraph one_linear, fused;
    for (bool use_qkv : {false, true}) {
      QkvGraph& q = use_qkv ? fused : one_linear;
      q.x = q.g.input("x", {rows, C});
      const ValueId x_bf16 = q.g.graph.add_value("x.bf16", {rows, C}, DType::kBF16);
      q.g.graph.add_op<CastOp>("x.cast", {q.x}, {x_bf16}, {}, rows, C);
      q.g.bf16_weight_copies = true;
      q.weight = q.g.param("c_attn.weight", {4 * C, C}, 0.0f, 0.3f);
      q.bias = q.g.param("c_attn.bias", {4 * C}, 0.0f, 0.3f);
      q.y = q.g.value("qkv", {rows, 3 * C});
      if (use_qkv)
        q.g.op<QkvLinearOp>({x_bf16}, {q.y}, {q.weight, q.bias}, rows, C, C, 3, true, C);
      else
        q.g.op<LinearOp>({x_bf16}, {q.y}, {q.weight, q.bias}, rows, C, 3 * C, true, C);
      q.g.finish(q.y);
      run_step(q.g);
    }
    EXPECT_EQ(fused.g.ws.values[fused.y].to_host_vector(),
              one_linear.g.ws.values[one_linear.y].to_host_vector());
    EXPECT_EQ(fused.g.ws.grads[fused.x].to_host_vector(),
              one_linear.g.ws.grads[one_linear.x].to_host_vector());
    for (ParamId id : {fused.weight, fused.bias}) {
      EXPECT_EQ(fused.g.params[id].grad.to_host_vector(),
                one_linear.g.params[id].grad.to_host_vector())
          << fused.g.params[id].name << " on " << team << " thread(s)";
      EXPECT_GT(max_abs(one_linear.g.params[id].grad), 1e-3f);
    }
  }
  omp_set_num_threads(threads);
}

TEST(QkvLinearOpTest, GradientsMatchFiniteDifferences) {
  QkvGraph q;
  build_qkv(q, true, 3, 4, 4, 1);
  op_test::expect_gradients_match(q.g, op_test::kLinearTolerance);
}

// ---- BatchedLayerNormOp against per-head LayerNormOps ----

struct HeadsGraph {
  OpGraph g;
  ValueId q = -1, k = -1, y = -1;
  std::vector<ParamId> params;  // q_norm.weight, q_norm.bias, k_norm.weight, k_norm.bias
};

// One LayerNorm over each head's columns of q, then of k, with q's heads sharing one (weight,
// bias) and k's another, writing y [rows, 2C] through column views: qk_norm's eager form.
void build_heads(HeadsGraph& h, bool fused, int64_t rows, int64_t C, int n_head) {
  const int64_t hd = C / n_head;
  h.q = h.g.input("q", {rows, C});
  h.k = h.g.input("k", {rows, C});
  h.params = {
      h.g.param("q_norm.weight", {hd}, 1.0f, 0.3f), h.g.param("q_norm.bias", {hd}, 0.0f, 0.3f),
      h.g.param("k_norm.weight", {hd}, 1.0f, 0.3f), h.g.param("k_norm.bias", {hd}, 0.0f, 0.3f)};
  h.y = h.g.value("qk_norm", {rows, 2 * C});
  std::vector<ValueId> ins, outs;
  std::vector<ParamId> ps;
  for (int part = 0; part < 2; ++part)
    for (int head = 0; head < n_head; ++head) {
      const std::string name = std::string(part ? "k" : "q") + "_norm." + std::to_string(head);
      const ValueId in = h.g.graph.add_view(name + ".in", part ? h.k : h.q, head * hd, hd);
      const ValueId out = h.g.graph.add_view(name, h.y, part * C + head * hd, hd);
      const ParamId weight = h.params[2 * part], bias = h.params[2 * part + 1];
      if (!fused) h.g.graph.add_op<LayerNormOp>(name, {in}, {out}, {weight, bias}, rows, hd);
      ins.push_back(in);
      outs.push_back(out);
      ps.insert(ps.end(), {weight, bias});
    }
  if (fused) h.g.op<BatchedLayerNormOp>(ins, outs, ps, rows, hd, 2 * n_head);
  h.g.finish(h.y);
}

// The same row math in the same order: forward, input and parameter gradients are bit-equal.
void expect_heads_twins_bit_equal(int64_t rows, int64_t C, int n_head) {
  HeadsGraph unfused, fused;
  build_heads(unfused, false, rows, C, n_head);
  build_heads(fused, true, rows, C, n_head);
  run_step(unfused.g);
  run_step(fused.g);
  EXPECT_EQ(rel_diff(fused.g.ws.values[fused.y], unfused.g.ws.values[unfused.y]), 0.0f);
  EXPECT_EQ(rel_diff(fused.g.ws.grads[fused.q], unfused.g.ws.grads[unfused.q]), 0.0f);
  EXPECT_EQ(rel_diff(fused.g.ws.grads[fused.k], unfused.g.ws.grads[unfused.k]), 0.0f);
  for (size_t p = 0; p < fused.params.size(); ++p) {
    const Tensor& expected = unfused.g.params[unfused.params[p]].grad;
    EXPECT_EQ(rel_diff(fused.g.params[fused.params[p]].grad, expected), 0.0f)
        << unfused.g.params[unfused.params[p]].name;
    EXPECT_GT(max_abs(expected), 1e-3f) << unfused.g.params[unfused.params[p]].name;
  }
  EXPECT_GT(max_abs(unfused.g.ws.grads[unfused.q]), 1e-3f);
}

TEST(BatchedLayerNormOpTest, MatchesPerHeadLayerNormsWithSharedParams) {
  expect_heads_twins_bit_equal(6, 16, 2);
}

TEST(BatchedLayerNormOpTest, MatchesPerHeadLayerNormsOnThreadsAtGptTinyShape) {
  // 512 rows × 8 LayerNorms × 32 columns takes the parallel path; rows are split over threads,
  // the parameter sums are not, so the bits cannot depend on the thread count.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  expect_heads_twins_bit_equal(512, 128, 4);
  omp_set_num_threads(threads);
}

TEST(BatchedLayerNormOpTest, GradientsMatchFiniteDifferences) {
  HeadsGraph h;
  build_heads(h, true, 3, 8, 2);
  op_test::expect_gradients_match(h.g, op_test::kSmoothTolerance);
}

// ---- The passes on a small GPT ----

GptShape small_gpt(bool qk_norm) {
  GptShape shape;
  shape.n_layer = 2;
  shape.n_head = 2;
  shape.d_model = 16;
  shape.seq_len = 8;
  shape.vocab_size = 256;
  shape.qk_norm = qk_norm;
  return shape;
}
constexpr int kBatch = 2;

// Random parameters (norm weights around 1) so every gradient is well above rounding noise.
struct GptFixture {
  explicit GptFixture(bool qk_norm) : shape(small_gpt(qk_norm)) {
    ids = register_gpt_params(shape, params);
    params.allocate();
    Rng rng(11);
    for (ParamId id = 0; id < params.size(); ++id) {
      Param& param = params[id];
      const float mean = param.init == ParamInit::kOnes ? 1.0f : 0.0f;
      for (int64_t i = 0; i < param.value.numel(); ++i)
        param.value.data()[i] = mean + 0.2f * rng.normal();
    }
  }
  Graph build(GraphMode mode = GraphMode::kTrain) const {
    return build_gpt_graph(shape, kBatch, ids, mode);
  }

  GptShape shape;
  ParamStore params;
  GptParamIds ids;
};

FusionResult fuse(Graph& graph, const ParamStore& params, const FusionOptions& options) {
  FusionPipeline pipeline;
  pipeline.add(make_qkv_pass());
  pipeline.add(make_batched_layernorm_pass());
  return pipeline.run(graph, params, options);
}

FusionOptions with_max_ops(int max_ops) {
  FusionOptions options;
  options.max_ops = max_ops;
  return options;
}

StepResult run_gpt(const Graph& graph, ParamStore& params) {
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  const int rows = kBatch * 8;
  Rng rng(3);
  for (int i = 0; i < rows; ++i) {
    ws.tokens.push_back(static_cast<int32_t>(rng.below(256)));
    ws.targets.push_back(static_cast<int32_t>(rng.below(256)));
  }
  params.zero_grads();
  executor.forward(ws);
  StepResult result;
  result.loss = executor.loss(ws);
  if (graph.mode == GraphMode::kEval) return result;
  executor.backward(ws);
  for (ParamId id = 0; id < params.size(); ++id) {
    const Tensor& grad = params[id].grad;
    result.grads.emplace_back(grad.data(), grad.data() + grad.numel());
  }
  return result;
}

const Value& value_named(const Graph& graph, const std::string& name) {
  for (const Value& value : graph.values)
    if (value.name == name) return value;
  ADD_FAILURE() << "no value '" << name << "'";
  return graph.values.front();
}

std::vector<FusionDecision> decisions_of(const FusionResult& result, const std::string& pass,
                                         bool fused) {
  std::vector<FusionDecision> selected;
  for (const FusionDecision& decision : result.decisions)
    if (decision.pass == pass && decision.fused == fused) selected.push_back(decision);
  return selected;
}

TEST(QkvPassTest, OneGemmPerBlockWritesQKVAsViewsOfOneRoot) {
  for (bool qk_norm : {false, true}) {
    SCOPED_TRACE(qk_norm ? "qk_norm" : "plain");
    GptFixture gpt(qk_norm);
    const Graph unfused = gpt.build();
    Graph graph = gpt.build();
    const FusionResult result = fuse(graph, gpt.params, FusionOptions());
    const int L = gpt.shape.n_layer, C = gpt.shape.d_model, NH = gpt.shape.n_head;
    EXPECT_EQ(count_kind(graph, OpKind::kQkvLinear), L);
    EXPECT_EQ(count_kind(graph, OpKind::kLinear), count_kind(unfused, OpKind::kLinear) - 3 * L);
    EXPECT_EQ(count_kind(graph, OpKind::kBatchedLayerNorm), qk_norm ? L : 0);
    EXPECT_EQ(count_kind(graph, OpKind::kLayerNorm),
              count_kind(unfused, OpKind::kLayerNorm) - (qk_norm ? 2 * NH * L : 0));
    EXPECT_EQ(graph.ops.size(), unfused.ops.size() - 2 * L - (qk_norm ? (2 * NH - 1) * L : 0));
    for (int layer = 0; layer < L; ++layer) {
      const std::string prefix = "h." + std::to_string(layer) + ".attn.";
      const Value& root = value_named(graph, prefix + "qkv");
      EXPECT_FALSE(root.is_view());
      EXPECT_EQ(root.shape.back(), 3 * C);
      // With qk_norm, q and k are read only through their heads' views, which make_view
      // re-rooted onto the fused buffer, so q and k themselves are dead and removed.
      const char* parts[] = {"q", "k", "v"};
      for (int part = qk_norm ? 2 : 0; part < 3; ++part) {
        const Value& view = value_named(graph, prefix + parts[part]);
        ASSERT_TRUE(view.is_view()) << view.name;
        EXPECT_EQ(graph.values[view.view_of].name, prefix + "qkv");
        EXPECT_EQ(view.column_offset, part * C);
      }
      if (qk_norm)  // the per-head LayerNorms' inputs were re-rooted onto the fused buffer
        for (int head = 0; head < NH; ++head) {
          const Value& in = value_named(graph, prefix + "k_norm." + std::to_string(head) + ".in");
          ASSERT_TRUE(in.is_view());
          EXPECT_EQ(graph.values[in.view_of].name, prefix + "qkv");
          EXPECT_EQ(in.column_offset, C + head * (C / NH));
        }
    }
    // Fused only at the q Linears; c_proj and the MLP Linears are no candidates.
    const std::vector<FusionDecision> fused = decisions_of(result, "qkv", true);
    ASSERT_EQ(static_cast<int>(fused.size()), L);
    for (int layer = 0; layer < L; ++layer) {
      EXPECT_EQ(fused[layer].site, "h." + std::to_string(layer) + ".attn.q");
      EXPECT_EQ(fused[layer].ops_absorbed, 3);
    }
    EXPECT_TRUE(decisions_of(result, "qkv", false).empty());
    for (const auto& op : graph.ops) {
      const OpKind kind = op->op_kind();
      if (kind == OpKind::kQkvLinear || kind == OpKind::kBatchedLayerNorm) {
        EXPECT_EQ(op->eager_ops, kind == OpKind::kQkvLinear ? 3 : 2 * NH) << op->name;
      }
    }
  }
}

TEST(QkvPassTest, LossAndEveryParameterGradientMatchTheUnfusedGraph) {
  for (bool qk_norm : {false, true})
    for (int max_ops : {4, 3, 2}) {
      SCOPED_TRACE(std::string(qk_norm ? "qk_norm" : "plain") + " max_ops " +
                   std::to_string(max_ops));
      GptFixture gpt(qk_norm);
      const Graph unfused = gpt.build();
      Graph graph = gpt.build();
      fuse(graph, gpt.params, with_max_ops(max_ops));
      ASSERT_GT(count_kind(graph, OpKind::kQkvLinear), 0);
      const StepResult expected = run_gpt(unfused, gpt.params);
      expect_same_step(run_gpt(graph, gpt.params), expected, gpt.params);

      const Graph unfused_eval = gpt.build(GraphMode::kEval);
      Graph eval = gpt.build(GraphMode::kEval);
      fuse(eval, gpt.params, with_max_ops(max_ops));
      const float eval_loss = run_gpt(unfused_eval, gpt.params).loss;
      EXPECT_NEAR(run_gpt(eval, gpt.params).loss, eval_loss, 1e-5f * std::fabs(eval_loss));
    }
}

TEST(QkvPassTest, MaxOpsSplitsTheLinearsAndTheHeadLayerNormsGreedily) {
  GptFixture gpt(true);  // n_head 2: 4 head LayerNorms per block
  {
    Graph graph = gpt.build();
    const FusionResult result = fuse(graph, gpt.params, with_max_ops(2));
    EXPECT_EQ(count_kind(graph, OpKind::kQkvLinear), 2);  // q+k per block; v stays alone
    const std::vector<FusionDecision> fused = decisions_of(result, "qkv", true);
    ASSERT_EQ(fused.size(), 2u);
    EXPECT_EQ(fused[0].ops_absorbed, 2);
    EXPECT_NE(fused[0].reason.find("split at max_ops 2"), std::string::npos) << fused[0].reason;
    const std::vector<FusionDecision> skipped = decisions_of(result, "qkv", false);
    ASSERT_EQ(skipped.size(), 2u);
    EXPECT_EQ(skipped[0].site, "h.0.attn.v");
    EXPECT_EQ(skipped[0].reason, "max_ops 2");
    EXPECT_EQ(value_named(graph, "h.0.attn.qkv").shape.back(), 2 * gpt.shape.d_model);
    EXPECT_FALSE(value_named(graph, "h.0.attn.v").is_view());
    // 4 LayerNorms per block: two batched ops of 2.
    EXPECT_EQ(count_kind(graph, OpKind::kBatchedLayerNorm), 4);
    const std::vector<FusionDecision> ln = decisions_of(result, "batched_layernorm", true);
    ASSERT_EQ(ln.size(), 4u);
    for (const FusionDecision& decision : ln) {
      EXPECT_EQ(decision.ops_absorbed, 2);
      EXPECT_NE(decision.reason.find("split at max_ops 2"), std::string::npos);
    }
  }
  {
    Graph graph = gpt.build();
    const FusionResult result = fuse(graph, gpt.params, with_max_ops(3));
    EXPECT_EQ(count_kind(graph, OpKind::kQkvLinear), 2);
    EXPECT_EQ(count_kind(graph, OpKind::kBatchedLayerNorm), 2);  // 3 + 1 left over per block
    EXPECT_EQ(count_kind(graph, OpKind::kLayerNorm), 2 * 2 + 1 + 2);
    const std::vector<FusionDecision> skipped = decisions_of(result, "batched_layernorm", false);
    ASSERT_EQ(skipped.size(), 2u);
    EXPECT_EQ(skipped[0].site, "h.0.attn.k_norm.1");
    EXPECT_EQ(skipped[0].reason, "max_ops 3");
  }
  {
    const Graph unfused = gpt.build();
    Graph graph = gpt.build();
    const FusionResult result = fuse(graph, gpt.params, with_max_ops(1));
    EXPECT_EQ(graph.ops.size(), unfused.ops.size());
    EXPECT_TRUE(decisions_of(result, "qkv", true).empty());
    EXPECT_TRUE(decisions_of(result, "batched_layernorm", true).empty());
    EXPECT_EQ(decisions_of(result, "qkv", false).size(), 6u);  // every Linear of each group
  }
}

TEST(QkvPassTest, SwitchedOffPassesLeaveTheGraphAlone) {
  GptFixture gpt(true);
  const Graph unfused = gpt.build();
  Graph graph = gpt.build();
  FusionOptions options;
  options.horizontal.qkv = false;
  options.horizontal.batched_layernorm = false;
  const FusionResult result = fuse(graph, gpt.params, options);
  EXPECT_EQ(graph.ops.size(), unfused.ops.size());
  EXPECT_TRUE(result.decisions.empty());
}

}  // namespace
}  // namespace ft
