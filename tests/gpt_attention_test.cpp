// Tests for attention, per-head (qk_norm) LayerNorms, the tied LM head and dropout, plus large
// shapes that take the ops' OpenMP paths. Tolerances are explained at the top of
// tests/gpt_ops_test.cpp.
#include "tests/op_test_util.h"

namespace ft {
namespace {

using namespace op_test;

// Straightforward per-head attention in double, for comparison with the gemm-based chain.
std::vector<double> naive_attention(const float* qkv, int B, int T, int C, int NH) {
  const int hd = C / NH;
  std::vector<double> y(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * 3 * C + h * hd;
        std::vector<double> weights(t + 1);
        double max_score = -1e300, sum = 0;
        for (int s = 0; s <= t; ++s) {
          const float* k = qkv + (b * T + s) * 3 * C + C + h * hd;
          double dot = 0;
          for (int i = 0; i < hd; ++i) dot += static_cast<double>(q[i]) * k[i];
          weights[s] = dot / std::sqrt(static_cast<double>(hd));
          max_score = std::max(max_score, weights[s]);
        }
        for (int s = 0; s <= t; ++s) sum += (weights[s] = std::exp(weights[s] - max_score));
        for (int s = 0; s <= t; ++s) {
          const float* v = qkv + (b * T + s) * 3 * C + 2 * C + h * hd;
          for (int i = 0; i < hd; ++i) y[(b * T + t) * C + h * hd + i] += weights[s] / sum * v[i];
        }
      }
  return y;
}

// The eager attention chain over one fused [B, T, 3C] qkv input, as model/gpt.cpp builds it:
// q, k, v are column views, then scores -> causal softmax -> mix. The softmax is the op under
// test (the one whose backward the accumulation check repeats): backward_accumulation_error
// compares a view's gradient as if it were contiguous, so it needs an op that reads no view.
// Returns y [B, T, C].
ValueId add_attention_chain(OpGraph& g, ValueId qkv, int B, int T, int C, int NH) {
  const ValueId q = g.graph.add_view("q", qkv, 0, C);
  const ValueId k = g.graph.add_view("k", qkv, C, C);
  const ValueId v = g.graph.add_view("v", qkv, 2 * C, C);
  const ValueId scores = g.value("scores", {B, NH, T, T});
  const ValueId probs = g.value("probs", {B, NH, T, T});
  const ValueId y = g.value("y", {B, T, C});
  g.graph.add_op<AttentionScoresOp>("scores", {q, k}, {scores}, {}, B, T, C, NH);
  g.op<CausalSoftmaxOp>({scores}, {probs}, {}, B, NH, T);
  g.graph.add_op<AttentionMixOp>("mix", {probs, v}, {y}, {}, B, T, C, NH);
  return y;
}

TEST(AttentionChainTest, GradientsMatchFiniteDifferences) {
  OpGraph g;
  const ValueId qkv = g.input("qkv", {2, 5, 24});
  const ValueId y = add_attention_chain(g, qkv, 2, 5, 8, 2);
  g.finish(y);
  expect_gradients_match(g, kSmoothTolerance);
}

TEST(AttentionChainTest, ForwardMatchesNaiveAttention) {
  const int B = 2, T = 7, C = 12, NH = 3;
  OpGraph g;
  const ValueId qkv = g.input("qkv", {B, T, 3 * C});
  const ValueId y = add_attention_chain(g, qkv, B, T, C, NH);
  g.finish(y);
  g.forward();
  const std::vector<double> expected = naive_attention(g.data(qkv), B, T, C, NH);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(g.data(y)[i], expected[i], 1e-5) << i;
}

TEST(AttentionChainTest, OutputAtTDoesNotDependOnLaterTokens) {
  const int B = 2, T = 6, C = 8, NH = 2, t0 = 2;
  OpGraph g;
  const ValueId qkv = g.input("qkv", {B, T, 3 * C});
  const ValueId y = add_attention_chain(g, qkv, B, T, C, NH);
  g.finish(y);
  g.forward();
  const std::vector<float> before(g.data(y), g.data(y) + B * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = t0 + 1; t < T; ++t)
      for (int c = 0; c < 3 * C; ++c) g.data(qkv)[(b * T + t) * 3 * C + c] += 3.0f;
  g.forward();
  float later_change = 0.0f;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const int i = (b * T + t) * C + c;
        if (t <= t0)
          EXPECT_NEAR(g.data(y)[i], before[i], 1e-6) << "b=" << b << " t=" << t;
        else
          later_change = std::max(later_change, std::fabs(g.data(y)[i] - before[i]));
      }
  EXPECT_GT(later_change, 0.1f);  // the perturbation is visible where it is allowed to be
}

// qk_norm's eager form: one LayerNorm per head over that head's columns of q and of k (column
// views), q's heads sharing one (weight, bias) pair and k's another, writing y [rows, 2C].
struct HeadNormGraph {
  OpGraph g;
  ValueId q = -1, k = -1, y = -1;
  std::vector<ParamId> ps;  // qw, qb, kw, kb
};

void build_head_norms(HeadNormGraph& h, int rows, int C, int NH, bool batched) {
  const int hd = C / NH;
  h.q = h.g.input("q", {rows, C});
  h.k = h.g.input("k", {rows, C});
  h.ps = {h.g.param("qw", {hd}, 1.0f, 0.3f), h.g.param("qb", {hd}, 0.0f, 0.3f),
          h.g.param("kw", {hd}, 1.0f, 0.3f), h.g.param("kb", {hd}, 0.0f, 0.3f)};
  h.y = h.g.value("y", {rows, 2 * C});
  std::vector<ValueId> ins, outs;
  std::vector<ParamId> ps;
  for (int part = 0; part < 2; ++part)
    for (int head = 0; head < NH; ++head) {
      const std::string name = std::string(part ? "k" : "q") + "_norm." + std::to_string(head);
      ins.push_back(h.g.graph.add_view(name + ".in", part ? h.k : h.q, head * hd, hd));
      outs.push_back(h.g.graph.add_view(name, h.y, part * C + head * hd, hd));
      ps.insert(ps.end(), {h.ps[2 * part], h.ps[2 * part + 1]});
      if (!batched)
        h.g.op<LayerNormOp>({ins.back()}, {outs.back()}, {ps[ps.size() - 2], ps.back()}, rows, hd);
    }
  if (batched) h.g.op<BatchedLayerNormOp>(ins, outs, ps, rows, hd, 2 * NH);
  h.g.finish(h.y);
}

TEST(HeadLayerNormTest, BatchedGradientsMatchFiniteDifferences) {
  HeadNormGraph h;
  build_head_norms(h, 3, 8, 2, true);
  expect_gradients_match(h.g, kSmoothTolerance);
}

TEST(HeadLayerNormTest, PerHeadLayerNormsNormaliseEachHeadSlice) {
  const int C = 8, NH = 2, hd = 4, rows = 3;
  for (bool batched : {false, true}) {
    HeadNormGraph h;
    build_head_norms(h, rows, C, NH, batched);
    h.g.forward();
    for (int r = 0; r < rows; ++r)
      for (int part = 0; part < 2; ++part)  // q then k
        for (int head = 0; head < NH; ++head) {
          const float* in = h.g.data(part ? h.k : h.q) + r * C + head * hd;
          const float* out = h.g.data(h.y) + r * 2 * C + part * C + head * hd;
          double mean = 0, var = 0;
          for (int i = 0; i < hd; ++i) mean += in[i] / static_cast<double>(hd);
          for (int i = 0; i < hd; ++i) var += std::pow(in[i] - mean, 2) / hd;
          const float* w = h.g.params[h.ps[2 * part]].value.data();
          const float* b = h.g.params[h.ps[2 * part + 1]].value.data();
          for (int i = 0; i < hd; ++i)
            EXPECT_NEAR(out[i], (in[i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i], 1e-5);
        }
  }
}

TEST(TiedLmHeadOpTest, GradientsAndForward) {
  OpGraph g;
  const ValueId x = g.input("x", {4, 6});
  const ValueId logits = g.value("logits", {4, 9});
  const ParamId wte = g.param("wte", {9, 6}, 0.0f, 0.5f);
  g.op<TiedLmHeadOp>({x}, {logits}, {wte}, 4, 6, 9);
  g.finish(logits);
  g.forward();
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < 9; ++v) {
      double expected = 0;
      for (int c = 0; c < 6; ++c)
        expected += g.data(x)[r * 6 + c] * g.params[wte].value.data()[v * 6 + c];
      EXPECT_NEAR(g.data(logits)[r * 9 + v], expected, 1e-5);
    }
  expect_gradients_match(g, kLinearTolerance);
}

// Shapes large enough to take the ops' OpenMP-parallel paths (ctest runs with 2 threads).
// A weighted sum over ~7e4 outputs is a loss of ~260, whose float round-off (~1.5e-5) would be
// ~2e-3 of an O(1) gradient at eps = 1e-2; eps = 5e-2 brings it to ~4e-4, and the five-point
// stencil's O(eps^4) truncation stays below that for these O(1) inputs.
constexpr float kLargeEps = 5e-2f;
TEST(LargeShapeTest, AttentionMatchesNaiveAndGradients) {
  const int B = 1, T = 130, C = 16, NH = 4;  // NH * T * T > 65536
  OpGraph g;
  const ValueId qkv = g.input("qkv", {B, T, 3 * C});
  const ValueId y = add_attention_chain(g, qkv, B, T, C, NH);
  g.finish(y);
  g.forward();
  const std::vector<double> expected = naive_attention(g.data(qkv), B, T, C, NH);
  for (size_t i = 0; i < expected.size(); ++i) ASSERT_NEAR(g.data(y)[i], expected[i], 1e-5) << i;
  expect_gradients_match(g, kSmoothTolerance, 1e-2f, kLargeEps);
}

TEST(LargeShapeTest, CrossEntropyMatchesDoubleReference) {
  const int rows = 256, classes = 200;  // rows * classes > 32768
  OpGraph g;
  const ValueId logits = g.input("logits", {rows, classes});
  const ValueId loss = g.value("loss", {1});
  g.op<SoftmaxCrossEntropyOp>({logits}, {loss}, {}, rows, classes);
  g.finish(-1, loss);
  for (int r = 0; r < rows; ++r) g.ws.targets.push_back((r * 7) % classes);
  g.params.zero_grads();
  g.executor->forward(g.ws);
  g.executor->backward(g.ws);
  double expected_loss = 0;
  for (int r = 0; r < rows; ++r) {
    const float* z = g.data(logits) + r * classes;
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c]));
    expected_loss += (std::log(sum) - z[g.ws.targets[r]]) / rows;
    for (int c = 0; c < classes; ++c) {
      const double grad =
          (std::exp(static_cast<double>(z[c])) / sum - (c == g.ws.targets[r])) / rows;
      ASSERT_NEAR(g.ws.grads[logits].data()[r * classes + c], grad, 1e-7);
    }
  }
  EXPECT_NEAR(g.data(loss)[0], expected_loss, 1e-5);
}

TEST(LargeShapeTest, LayerNormAndBatchedHeadLayerNormGradients) {
  OpGraph ln;
  const ValueId x = ln.input("x", {600, 128});  // rows * C > 65536
  const ValueId y = ln.value("y", {600, 128});
  ln.op<LayerNormOp>({x}, {y}, {ln.param("w", {128}, 1.0f, 0.3f), ln.param("b", {128}, 0.0f, 0.3f)},
                     600, 128);
  ln.finish(y);
  expect_gradients_match(ln, kSmoothTolerance, 1e-2f, kLargeEps);

  HeadNormGraph qk;  // 300 rows * 8 LayerNorms * 32 columns > 65536
  build_head_norms(qk, 300, 128, 4, true);
  expect_gradients_match(qk.g, kSmoothTolerance, 1e-2f, kLargeEps);
}

// A dropout graph over `numel` inputs all equal to 1, so kept outputs show the scale directly.
struct DropoutGraph {
  DropoutGraph(int64_t numel, float p, uint64_t salt) {
    x = g.input("x", {numel});
    y = g.value("y", {numel});
    op = &g.op<DropoutOp>({x}, {y}, {}, numel, p, salt);
    g.finish(y);
    std::fill(g.data(x), g.data(x) + numel, 1.0f);
  }
  std::vector<float> run(uint64_t seed) {
    g.ws.dropout_seed = seed;
    g.forward();
    return std::vector<float>(g.data(y), g.data(y) + g.ws.values[y].numel());
  }
  OpGraph g;
  ValueId x, y;
  DropoutOp* op;
};

// Eval graphs are built without dropout ops, so p = 0 is the only identity case.
TEST(DropoutOpTest, IdentityWhenPIsZero) {
  DropoutGraph zero_p(100, 0.0f, 1);
  for (float value : zero_p.run(7)) EXPECT_EQ(value, 1.0f);
  EXPECT_FALSE(zero_p.op->masked());
  expect_gradients_match(zero_p.g, kLinearTolerance);
}

TEST(DropoutOpTest, HalfKeptAndScaledByTwo) {
  const int64_t numel = 100000;  // above the threshold for the parallel loop
  DropoutGraph half(numel, 0.5f, 3);
  const std::vector<float> out = half.run(11);
  int64_t kept = 0;
  for (float value : out) {
    EXPECT_TRUE(value == 0.0f || value == 2.0f) << value;
    kept += value == 2.0f;
  }
  // Binomial(100000, 0.5) has std 158; 0.5 +- 0.01 is a 6.3-sigma band.
  EXPECT_NEAR(static_cast<double>(kept) / numel, 0.5, 0.01);
  EXPECT_TRUE(half.op->masked());
}

TEST(DropoutOpTest, MaskIsAPureFunctionOfSeedAndSalt) {
  DropoutGraph a(1000, 0.3f, 3), b(1000, 0.3f, 3), other_salt(1000, 0.3f, 4);
  const std::vector<float> first = a.run(42);
  EXPECT_EQ(first, b.run(42));
  EXPECT_EQ(first, a.run(42));
  EXPECT_NE(first, a.run(43));
  EXPECT_NE(first, other_salt.run(42));
  // Backward reuses the forward mask: gradient checking a masked op needs it to be fixed.
  a.run(42);
  expect_gradients_match(a.g, kLinearTolerance);
}

TEST(DropoutOpTest, RejectsBadProbability) {
  EXPECT_THROW(DropoutOp(10, 1.0f, 0), Error);
  EXPECT_THROW(DropoutOp(10, -0.1f, 0), Error);
  EXPECT_THROW(DropoutOp(10, std::nanf(""), 0), Error);
}

TEST(OpWiringTest, WrongShapesAreReported) {
  OpGraph g;
  const ValueId x = g.input("x", {6, 5});
  const ValueId y = g.value("y", {6, 8});  // op expects [6, 7]
  g.op<LinearOp>({x}, {y}, {g.param("w", {7, 5}, 0.0f, 1.0f)}, 6, 5, 7, false);
  g.finish(y);
  EXPECT_THROW(g.forward(), Error);
}

}  // namespace
}  // namespace ft
