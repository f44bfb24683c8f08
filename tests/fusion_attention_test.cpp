// Tests for fusion.vertical.attention: the three eager attention ops (scores, causal softmax, mix)
// against a double-precision reference and finite differences, with q/k/v both as column views of
// one [rows, 3C] buffer and as separate roots; FlashAttentionOp against the three-op chain it
// replaces (forward and every input gradient within 1e-5 of the largest, at tile sizes that do
// not divide T); fresh-gradient overwrites checked against NaN-filled buffers; and the pass
// applying where it should, refusing a shared intermediate, and respecting max_ops.
// Gradcheck tolerances are explained at the top of tests/gpt_ops_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "fusion/ops/flash_attention.h"
#include "fusion/passes.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/graph_edit.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/causal_softmax.h"
#include "tests/op_test_util.h"

namespace ft {
namespace {

using namespace op_test;

enum class QkvLayout { kViewsOfOneBuffer, kSeparateRoots };

struct Qkv {
  ValueId q, k, v;
};

// q, k, v as [rows, C] views at columns 0, C, 2C of one [rows, 3C] input, or as three inputs.
Qkv add_qkv(OpGraph& g, int64_t rows, int64_t C, QkvLayout layout) {
  if (layout == QkvLayout::kSeparateRoots)
    return {g.input("q", {rows, C}), g.input("k", {rows, C}), g.input("v", {rows, C})};
  const ValueId qkv = g.input("qkv", {rows, 3 * C});
  return {g.graph.add_view("q", qkv, 0, C), g.graph.add_view("k", qkv, C, C),
          g.graph.add_view("v", qkv, 2 * C, C)};
}

// Element (row, c) of a [rows, C] value read through its row stride.
float at(Workspace& ws, ValueId id, int64_t row, int64_t c) {
  return ws.values[id].data()[row * ws.row_stride(id) + c];
}

// Causal attention in double: scores [B, NH, T, T], probs (zero above the diagonal), y [B*T, C].
struct Reference {
  std::vector<double> scores, probs, y;
};
Reference reference_attention(Workspace& ws, Qkv qkv, int B, int T, int C, int NH) {
  const int hd = C / NH;
  Reference ref;
  ref.scores.assign(static_cast<size_t>(B) * NH * T * T, 0.0);
  ref.probs = ref.scores;
  ref.y.assign(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const size_t row = ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        double max_score = -1e300, sum = 0;
        for (int s = 0; s < T; ++s) {
          double dot = 0;
          for (int i = 0; i < hd; ++i)
            dot += static_cast<double>(at(ws, qkv.q, b * T + t, h * hd + i)) *
                   at(ws, qkv.k, b * T + s, h * hd + i);
          ref.scores[row + s] = dot / std::sqrt(static_cast<double>(hd));
          if (s <= t) max_score = std::max(max_score, ref.scores[row + s]);
        }
        for (int s = 0; s <= t; ++s) sum += std::exp(ref.scores[row + s] - max_score);
        for (int s = 0; s <= t; ++s) {
          ref.probs[row + s] = std::exp(ref.scores[row + s] - max_score) / sum;
          for (int i = 0; i < hd; ++i)
            ref.y[(static_cast<size_t>(b) * T + t) * C + h * hd + i] +=
                ref.probs[row + s] * at(ws, qkv.v, b * T + s, h * hd + i);
        }
      }
  return ref;
}

// max |actual - expected| <= tolerance * max(|expected|, scale), which must not be ~0; `scale`
// lets a gradient that is exactly 0 (dq and dk at T = 1) be judged against its siblings.
void expect_close_to_largest(const float* actual, const double* expected, int64_t numel,
                             double tolerance, const char* what, double scale = 0) {
  double largest = scale, worst = 0;
  int64_t worst_at = 0;
  for (int64_t i = 0; i < numel; ++i) {
    largest = std::max(largest, std::fabs(expected[i]));
    const double error = std::fabs(actual[i] - expected[i]);
    if (std::isnan(error) ? !std::isnan(worst) : error > worst) worst = error, worst_at = i;
  }
  EXPECT_GT(largest, 1e-6) << what << ": reference is all ~0, the comparison would be vacuous";
  EXPECT_LE(worst, tolerance * largest)
      << what << "[" << worst_at << "]: " << actual[worst_at] << " vs " << expected[worst_at];
}
void expect_close_to_largest(const Tensor& actual, const Tensor& expected, double tolerance,
                             const char* what, double scale = 0) {
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  std::vector<double> wide(expected.data(), expected.data() + expected.numel());
  expect_close_to_largest(actual.data(), wide.data(), actual.numel(), tolerance, what, scale);
}
double largest_magnitude(const Tensor& tensor) {
  double largest = 0;
  for (int64_t i = 0; i < tensor.numel(); ++i)
    largest = std::max(largest, std::fabs(static_cast<double>(tensor.data()[i])));
  return largest;
}

constexpr QkvLayout kLayouts[] = {QkvLayout::kViewsOfOneBuffer, QkvLayout::kSeparateRoots};

TEST(AttentionScoresOpTest, ForwardAndGradientsOnViewsAndRoots) {
  const int B = 2, T = 5, C = 12, NH = 3;
  for (QkvLayout layout : kLayouts) {
    OpGraph g;
    const Qkv qkv = add_qkv(g, B * T, C, layout);
    const ValueId scores = g.value("scores", {B, NH, T, T});
    g.op<AttentionScoresOp>({qkv.q, qkv.k}, {scores}, {}, B, T, C, NH);
    g.finish(scores);
    g.forward();
    const Reference ref = reference_attention(g.ws, qkv, B, T, C, NH);
    expect_close_to_largest(g.data(scores), ref.scores.data(), B * NH * T * T, 1e-6, "scores");
    // Linear in each perturbed entry, but entries near the floor measure 2.8e-3 of round-off,
    // too close to kLinearTolerance; a wrong backward is off by O(1) either way.
    expect_gradients_match(g, kSmoothTolerance);
  }
}

TEST(CausalSoftmaxOpTest, ForwardAndGradients) {
  const int B = 2, NH = 2, T = 6;
  OpGraph g;
  const ValueId scores = g.input("scores", {B, NH, T, T});
  const ValueId probs = g.value("probs", {B, NH, T, T});
  g.op<CausalSoftmaxOp>({scores}, {probs}, {}, B, NH, T);
  g.finish(probs);
  g.forward();
  for (int row = 0; row < B * NH * T; ++row) {
    const int t = row % T;
    const float* s_row = g.data(scores) + row * T;
    double sum = 0;
    for (int s = 0; s <= t; ++s) sum += std::exp(static_cast<double>(s_row[s]));
    for (int s = 0; s < T; ++s) {
      const double expected = s <= t ? std::exp(static_cast<double>(s_row[s])) / sum : 0.0;
      EXPECT_NEAR(g.data(probs)[row * T + s], expected, 1e-6) << "row " << row << " s " << s;
    }
  }
  expect_gradients_match(g, kSmoothTolerance);
}

TEST(AttentionMixOpTest, ForwardAndGradientsOnViewsAndRoots) {
  const int B = 2, T = 5, C = 12, NH = 3, hd = C / NH;
  for (QkvLayout layout : kLayouts) {
    OpGraph g;
    const ValueId probs = g.input("probs", {B, NH, T, T});
    const Qkv qkv = add_qkv(g, B * T, C, layout);
    const ValueId y = g.value("y", {B, T, C});
    g.op<AttentionMixOp>({probs, qkv.v}, {y}, {}, B, T, C, NH);
    g.finish(y);
    g.forward();
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) {
          const int h = c / hd;
          double expected = 0;
          for (int s = 0; s < T; ++s)
            expected += static_cast<double>(g.data(probs)[((b * NH + h) * T + t) * T + s]) *
                        at(g.ws, qkv.v, b * T + s, c);
          EXPECT_NEAR(g.data(y)[(b * T + t) * C + c], expected, 1e-5);
        }
    expect_gradients_match(g, kLinearTolerance);
  }
}

TEST(FlashAttentionOpTest, ForwardAndGradientsOnViewsAndRoots) {
  const int B = 2, T = 7, C = 8, NH = 2;
  for (QkvLayout layout : kLayouts) {
    OpGraph g;
    const Qkv qkv = add_qkv(g, B * T, C, layout);
    const ValueId y = g.value("y", {B, T, C});
    g.op<FlashAttentionOp>({qkv.q, qkv.k, qkv.v}, {y}, {}, B, T, C, NH, 3);
    g.finish(y);
    g.forward();
    const Reference ref = reference_attention(g.ws, qkv, B, T, C, NH);
    expect_close_to_largest(g.data(y), ref.y.data(), B * T * C, 1e-6, "y");
    expect_gradients_match(g, kSmoothTolerance);
  }
}

// An op over separate roots: backward into NaN-filled gradients marked fresh must equal backward
// accumulating into zeroed ones, so every element of a fresh gradient is written.
void expect_fresh_gradients_overwritten(OpGraph& g) {
  Op& op = *g.op_under_test;
  g.forward();
  Rng rng(17);
  Tensor& dout = g.ws.grads[op.outputs[0]];
  for (int64_t i = 0; i < dout.numel(); ++i) dout.data()[i] = rng.normal();
  g.ws.grad_fresh.assign(g.ws.grads.size(), 0);
  for (ValueId id : op.inputs) g.ws.grads[id].fill(0.0f);
  op.backward(g.ws, g.params);
  std::vector<Tensor> accumulated;
  for (ValueId id : op.inputs) {
    accumulated.push_back(Tensor::empty(g.ws.grads[id].shape()));
    accumulated.back().copy_from(g.ws.grads[id]);
    g.ws.grads[id].fill(std::numeric_limits<float>::quiet_NaN());
    g.ws.grad_fresh[id] = 1;
  }
  op.backward(g.ws, g.params);
  for (size_t i = 0; i < op.inputs.size(); ++i)
    expect_close_to_largest(g.ws.grads[op.inputs[i]], accumulated[i], 0.0,
                            g.graph.values[op.inputs[i]].name.c_str());
}

TEST(AttentionOpsTest, FreshGradientsAreOverwritten) {
  const int B = 2, T = 6, C = 8, NH = 2;
  const QkvLayout roots = QkvLayout::kSeparateRoots;
  {
    OpGraph g;
    const Qkv qkv = add_qkv(g, B * T, C, roots);
    const ValueId scores = g.value("scores", {B, NH, T, T});
    g.op<AttentionScoresOp>({qkv.q, qkv.k}, {scores}, {}, B, T, C, NH);
    g.finish(scores);
    expect_fresh_gradients_overwritten(g);
  }
  {
    OpGraph g;
    const ValueId scores = g.input("scores", {B, NH, T, T});
    const ValueId probs = g.value("probs", {B, NH, T, T});
    g.op<CausalSoftmaxOp>({scores}, {probs}, {}, B, NH, T);
    g.finish(probs);
    expect_fresh_gradients_overwritten(g);
  }
  {
    OpGraph g;
    const ValueId probs = g.input("probs", {B, NH, T, T});
    const Qkv qkv = add_qkv(g, B * T, C, roots);
    const ValueId y = g.value("y", {B, T, C});
    g.op<AttentionMixOp>({probs, qkv.v}, {y}, {}, B, T, C, NH);
    g.finish(y);
    expect_fresh_gradients_overwritten(g);
  }
  {
    OpGraph g;
    const Qkv qkv = add_qkv(g, B * T, C, roots);
    const ValueId y = g.value("y", {B, T, C});
    g.op<FlashAttentionOp>({qkv.q, qkv.k, qkv.v}, {y}, {}, B, T, C, NH, 4);
    g.finish(y);
    expect_fresh_gradients_overwritten(g);
  }
}

// Attention over q, k, v inputs with a weighted-sum loss, as the eager chain or one
// FlashAttentionOp (tile > 0). The same seeds give the same inputs and loss weights in both forms.
struct AttentionGraph {
  AttentionGraph(int B, int T, int C, int NH, QkvLayout layout, int tile) {
    const int64_t rows = static_cast<int64_t>(B) * T;
    if (layout == QkvLayout::kSeparateRoots) {
      roots = {graph.add_value("q", {rows, C}), graph.add_value("k", {rows, C}),
               graph.add_value("v", {rows, C})};
      qkv = {roots[0], roots[1], roots[2]};
    } else {
      roots = {graph.add_value("qkv", {rows, 3 * C})};
      qkv = {graph.add_view("q", roots[0], 0, C), graph.add_view("k", roots[0], C, C),
             graph.add_view("v", roots[0], 2 * C, C)};
    }
    y = graph.add_value("y", {B, T, C});
    if (tile > 0) {
      graph.add_op<FlashAttentionOp>("attn.flash", {qkv.q, qkv.k, qkv.v}, {y}, {}, B, T, C, NH,
                                     tile);
    } else {
      const ValueId scores = graph.add_value("scores", {B, NH, T, T});
      const ValueId probs = graph.add_value("probs", {B, NH, T, T});
      graph.add_op<AttentionScoresOp>("attn.scores", {qkv.q, qkv.k}, {scores}, {}, B, T, C, NH);
      graph.add_op<CausalSoftmaxOp>("attn.softmax", {scores}, {probs}, {}, B, NH, T);
      graph.add_op<AttentionMixOp>("attn.mix", {probs, qkv.v}, {y}, {}, B, T, C, NH);
    }
    graph.output = y;
    add_weighted_sum_loss(graph, y, 23);
  }
  // Runs forward and backward on inputs ~ N(0, 1) from a fixed seed.
  void run() {
    params.allocate();
    executor = std::make_unique<Executor>(graph, params);
    ws = executor->make_workspace();
    Rng rng(3);
    for (ValueId id : roots)
      for (int64_t i = 0; i < ws.values[id].numel(); ++i) ws.values[id].data()[i] = rng.normal();
    executor->forward(ws);
    executor->backward(ws);
  }

  Graph graph;
  ParamStore params;
  Workspace ws;
  std::unique_ptr<Executor> executor;
  std::vector<ValueId> roots;
  Qkv qkv{};
  ValueId y = -1;
};

void expect_same_attention(AttentionGraph& fused, AttentionGraph& chain, const char* label) {
  SCOPED_TRACE(label);
  expect_close_to_largest(fused.ws.values[fused.y], chain.ws.values[chain.y], 1e-5, "y");
  // Relative to the largest of dq, dk and dv together, as one [rows, 3C] buffer would be.
  double largest = 0;
  for (ValueId id : chain.roots) largest = std::max(largest, largest_magnitude(chain.ws.grads[id]));
  for (size_t i = 0; i < chain.roots.size(); ++i) {
    const std::string what = "d" + chain.graph.values[chain.roots[i]].name;
    expect_close_to_largest(fused.ws.grads[fused.roots[i]], chain.ws.grads[chain.roots[i]], 1e-5,
                            what.c_str(), largest);
  }
}

TEST(FlashAttentionOpTest, MatchesTheEagerChain) {
  const int B = 2, NH = 2;
  // hd = 32 as in the presets; 24 pads the packed rows to a vector; 16 is one AVX-512 vector;
  // 64 takes two column blocks.
  for (int C : {64, 48, 32, 128})
    for (QkvLayout layout : kLayouts)
      for (int T : {1, 7, 64, 130}) {
        if (C != 64 && T == 130) continue;  // the long case once is enough
        AttentionGraph chain(B, T, C, NH, layout, 0);
        chain.run();
        for (int tile : {3, 24, 48, 200}) {
          AttentionGraph fused(B, T, C, NH, layout, tile);
          fused.run();
          const std::string label = "hd=" + std::to_string(C / NH) + " T=" + std::to_string(T) +
                                    " tile=" + std::to_string(tile) +
                                    (layout == QkvLayout::kSeparateRoots ? " roots" : " views");
          expect_same_attention(fused, chain, label.c_str());
          // The fused op keeps a log-sum-exp per row instead of two T x T matrices.
          EXPECT_EQ(static_cast<FlashAttentionOp&>(*fused.graph.ops[0]).lse().numel(), B * NH * T);
        }
      }
}

int apply_attention_pass(Graph& graph, const FusionOptions& options,
                         std::vector<FusionDecision>& decisions) {
  const ParamStore params;
  PassContext context{options, params, decisions};
  return make_attention_pass()->apply(graph, context);
}

TEST(AttentionPassTest, FusesTheChainAndMatchesIt) {
  const int B = 2, T = 64, C = 32, NH = 2;
  AttentionGraph chain(B, T, C, NH, QkvLayout::kViewsOfOneBuffer, 0);
  AttentionGraph fused(B, T, C, NH, QkvLayout::kViewsOfOneBuffer, 0);
  FusionOptions options;
  options.tile_kb = 1;  // 1 KiB = a 16 x 16 score tile
  std::vector<FusionDecision> decisions;
  EXPECT_TRUE(make_attention_pass()->enabled(options));
  ASSERT_EQ(apply_attention_pass(fused.graph, options, decisions), 1);
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_TRUE(decisions[0].fused);
  EXPECT_EQ(decisions[0].site, "attn.scores");
  EXPECT_EQ(decisions[0].ops_absorbed, 3);
  ASSERT_EQ(fused.graph.ops.size(), 2u);  // flash attention, loss
  const Op& flash = *fused.graph.ops[0];
  ASSERT_EQ(flash.op_kind(), OpKind::kFlashAttention);
  EXPECT_EQ(flash.eager_ops, 3);
  EXPECT_EQ(flash.name, "attn.flash_attention");
  EXPECT_EQ(static_cast<const FlashAttentionOp&>(flash).tile(), 16);
  EXPECT_EQ(flash.inputs, (std::vector<ValueId>{fused.qkv.q, fused.qkv.k, fused.qkv.v}));
  EXPECT_EQ(flash.outputs, std::vector<ValueId>{fused.y});
  // validate() wants every read value written: make the qkv buffer the graph input for it.
  fused.graph.input = fused.roots[0];
  EXPECT_NO_THROW(validate(fused.graph));
  fused.graph.input = -1;
  chain.run();
  fused.run();
  expect_same_attention(fused, chain, "pass");
}

TEST(AttentionPassTest, TileFollowsTileKb) {
  for (auto [tile_kb, T, expected] : {std::tuple{256, 64, 64}, std::tuple{256, 1024, 256},
                                      std::tuple{4, 1024, 32}, std::tuple{0, 1024, 8}}) {
    AttentionGraph graph(1, T, 8, 1, QkvLayout::kSeparateRoots, 0);
    FusionOptions options;
    options.tile_kb = tile_kb;
    std::vector<FusionDecision> decisions;
    ASSERT_EQ(apply_attention_pass(graph.graph, options, decisions), 1);
    EXPECT_EQ(static_cast<const FlashAttentionOp&>(*graph.graph.ops[0]).tile(), expected)
        << "tile_kb " << tile_kb << " T " << T;
  }
}

TEST(AttentionPassTest, RefusesProbabilitiesWithASecondConsumer) {
  AttentionGraph graph(1, 4, 8, 2, QkvLayout::kViewsOfOneBuffer, 0);
  const ValueId probs = graph.graph.ops[1]->outputs[0];
  const ValueId again = graph.graph.add_value("probs_again", {1, 2, 4, 4});
  graph.graph.add_op<CausalSoftmaxOp>("other_reader", {probs}, {again}, {}, 1, 2, 4);
  const size_t ops_before = graph.graph.ops.size();
  std::vector<FusionDecision> decisions;
  EXPECT_EQ(apply_attention_pass(graph.graph, FusionOptions{}, decisions), 0);
  EXPECT_EQ(graph.graph.ops.size(), ops_before);
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_FALSE(decisions[0].fused);
  EXPECT_EQ(decisions[0].reason, "'probs' has 2 consumers");
}

TEST(AttentionPassTest, RespectsMaxOps) {
  AttentionGraph graph(1, 4, 8, 2, QkvLayout::kViewsOfOneBuffer, 0);
  FusionOptions options;
  options.max_ops = 2;
  std::vector<FusionDecision> decisions;
  EXPECT_EQ(apply_attention_pass(graph.graph, options, decisions), 0);
  EXPECT_EQ(graph.graph.ops.size(), 4u);
  ASSERT_EQ(decisions.size(), 1u);
  EXPECT_FALSE(decisions[0].fused);
  EXPECT_EQ(decisions[0].reason, "max_ops 2");
  options.max_ops = 3;
  decisions.clear();
  EXPECT_EQ(apply_attention_pass(graph.graph, options, decisions), 1);
}

TEST(AttentionPassTest, FusesEveryBlockAndIsSwitchedByItsKey) {
  const int B = 1, T = 5, C = 8, NH = 2;
  AttentionGraph graph(B, T, C, NH, QkvLayout::kSeparateRoots, 0);
  Graph& g = graph.graph;
  g.ops.pop_back();  // the loss: a second block follows
  const ValueId y1 = graph.y;
  const ValueId scores = g.add_value("scores2", {B, NH, T, T});
  const ValueId probs = g.add_value("probs2", {B, NH, T, T});
  const ValueId y2 = g.add_value("y2", {B, T, C});
  g.add_op<AttentionScoresOp>("h.1.attn.scores", {y1, y1}, {scores}, {}, B, T, C, NH);
  g.add_op<CausalSoftmaxOp>("h.1.attn.softmax", {scores}, {probs}, {}, B, NH, T);
  g.add_op<AttentionMixOp>("h.1.attn.mix", {probs, y1}, {y2}, {}, B, T, C, NH);
  g.output = y2;
  add_weighted_sum_loss(g, y2, 5);
  FusionOptions options;
  options.vertical.attention = false;
  EXPECT_FALSE(make_attention_pass()->enabled(options));
  std::vector<FusionDecision> decisions;
  EXPECT_EQ(apply_attention_pass(g, FusionOptions{}, decisions), 2);
  ASSERT_EQ(g.ops.size(), 3u);
  EXPECT_EQ(g.ops[0]->op_kind(), OpKind::kFlashAttention);
  EXPECT_EQ(g.ops[1]->op_kind(), OpKind::kFlashAttention);
  EXPECT_EQ(g.ops[1]->name, "h.1.attn.flash_attention");
  EXPECT_EQ(g.ops[1]->inputs, (std::vector<ValueId>{y1, y1, y1}));
  ASSERT_EQ(decisions.size(), 2u);
  EXPECT_TRUE(decisions[0].fused && decisions[1].fused);
}

}  // namespace
}  // namespace ft
