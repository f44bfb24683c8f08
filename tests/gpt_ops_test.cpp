// Tests for the GPT ops in model/ops/: a finite-difference gradient check of every op (inputs and
// parameters), a check that every backward accumulates (+=), and forward checks against hand or
// naive computations (cross-entropy values, causal masking, attention, layer norms, dropout).
//
// Tolerances. Each op is wrapped in a graph whose loss is sum(output * w), w ~ N(0, 1), so the loss
// is O(sqrt(numel)) ~ 10 and typical gradient entries are 1e-2..1. gradcheck's five-point stencil
// with eps = 1e-2 carries ~1.5 * 6e-8 * 10 / 1e-2 ~ 1e-4 absolute round-off noise (less in
// practice: the loss is summed in double and rounded once) and O(eps^4) truncation, negligible for
// these O(1) inputs. Entries are compared relative to max(|a|, |n|, floor = 1e-2), which caps the
// noise near 1e-2 relative at worst; measured errors are 1e-5..3e-3. Ops that are linear in what
// is perturbed (linear, residual, embedding, dropout, lm head) have no truncation error at all
// and get the tighter tolerance. A wrong backward (missing term, wrong index, transpose) is off
// by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/check.h"
#include "core/math/gelu.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/attention.h"
#include "model/ops/cross_entropy.h"
#include "model/ops/dropout.h"
#include "model/ops/embedding.h"
#include "model/ops/gelu.h"
#include "model/ops/layernorm.h"
#include "model/ops/linear.h"
#include "model/ops/lm_head.h"
#include "model/ops/qk_norm.h"
#include "model/ops/residual.h"

namespace ft {
namespace {

constexpr float kLinearTolerance = 3e-3f;
constexpr float kSmoothTolerance = 1e-2f;

// A graph holding one op under test, random inputs and parameters, and (unless the op is itself a
// loss) a weighted-sum loss over the op's output.
class OpGraph {
 public:
  ValueId input(const std::string& name, const Shape& shape) {
    const ValueId id = graph.add_value(name, shape);
    inputs.push_back(id);
    return id;
  }
  ValueId value(const std::string& name, const Shape& shape) {
    return graph.add_value(name, shape);
  }
  ParamId param(const std::string& name, const Shape& shape, float mean, float std) {
    const ParamId id = params.add(name, shape, ParamInit::kZeros, 0.0f, true);
    param_fill.push_back({mean, std});
    return id;
  }
  template <typename OpType, typename... Args>
  OpType& op(std::vector<ValueId> ins, std::vector<ValueId> outs, std::vector<ParamId> ps,
             Args&&... args) {
    OpType& added = graph.add_op<OpType>("under_test", std::move(ins), std::move(outs),
                                         std::move(ps), std::forward<Args>(args)...);
    op_under_test = &added;
    return added;
  }
  // Seals the graph: adds the loss over `loss_input` (or uses `loss_value`), allocates and fills.
  void finish(ValueId loss_input, ValueId loss_value = -1) {
    if (loss_value >= 0)
      graph.loss = loss_value;
    else
      add_weighted_sum_loss(graph, loss_input, 99);
    params.allocate();
    Rng rng(5);
    for (ParamId id = 0; id < params.size(); ++id) {
      Tensor& values = params[id].value;
      for (int64_t i = 0; i < values.numel(); ++i)
        values.data()[i] = param_fill[id].first + param_fill[id].second * rng.normal();
    }
    executor = std::make_unique<Executor>(graph, params);
    ws = executor->make_workspace();
    for (ValueId id : inputs)
      for (int64_t i = 0; i < ws.values[id].numel(); ++i) ws.values[id].data()[i] = rng.normal();
  }
  GradcheckReport check(float floor, float eps) {
    GradcheckOptions options;
    options.floor = floor;
    options.eps = eps;
    return gradcheck(graph, params, ws, inputs, options);
  }
  float accumulation_error() {
    params.zero_grads();
    executor->forward(ws);
    executor->backward(ws);
    return backward_accumulation_error(*op_under_test, ws, params);
  }
  void forward() { executor->forward(ws); }
  float* data(ValueId id) { return ws.values[id].data(); }

  ParamStore params;
  Graph graph;
  Workspace ws;
  std::unique_ptr<Executor> executor;
  std::vector<ValueId> inputs;
  std::vector<std::pair<float, float>> param_fill;  // (mean, std) per param
  Op* op_under_test = nullptr;
};

void expect_gradients_match(OpGraph& g, float tolerance, float floor = 1e-2f, float eps = 1e-2f) {
  const GradcheckReport report = g.check(floor, eps);
  std::printf("  gradcheck: max rel error %.2e over %d entries, worst %s\n", report.max_rel_error,
              report.entries_checked, report.worst.c_str());
  EXPECT_LT(report.max_rel_error, tolerance) << "worst entry " << report.worst;
  EXPECT_GT(report.max_abs_grad, 1e-3f) << "gradients are all ~0: the check would be vacuous";
  EXPECT_GT(report.entries_checked, 0);
  EXPECT_LT(g.accumulation_error(), 1e-5f) << "backward overwrites instead of accumulating";
}

TEST(LinearOpTest, GradientsMatchFiniteDifferences) {
  for (bool has_bias : {true, false}) {
    OpGraph g;
    const ValueId x = g.input("x", {6, 5});
    const ValueId y = g.value("y", {6, 7});
    std::vector<ParamId> ps = {g.param("w", {7, 5}, 0.0f, 0.5f)};
    if (has_bias) ps.push_back(g.param("b", {7}, 0.0f, 0.5f));
    g.op<LinearOp>({x}, {y}, ps, 6, 5, 7, has_bias);
    g.finish(y);
    expect_gradients_match(g, kLinearTolerance);
  }
}

TEST(LinearOpTest, ForwardMatchesNaiveLoop) {
  OpGraph g;
  const ValueId x = g.input("x", {3, 4});
  const ValueId y = g.value("y", {3, 2});
  const ParamId w = g.param("w", {2, 4}, 0.0f, 1.0f), b = g.param("b", {2}, 0.0f, 1.0f);
  g.op<LinearOp>({x}, {y}, {w, b}, 3, 4, 2, true);
  g.finish(y);
  g.forward();
  for (int r = 0; r < 3; ++r)
    for (int o = 0; o < 2; ++o) {
      double expected = g.params[b].value.data()[o];
      for (int i = 0; i < 4; ++i)
        expected += g.data(x)[r * 4 + i] * g.params[w].value.data()[o * 4 + i];
      EXPECT_NEAR(g.data(y)[r * 2 + o], expected, 1e-5);
    }
}

TEST(ResidualAddOpTest, GradientsAndForward) {
  OpGraph g;
  const ValueId a = g.input("a", {4, 3}), b = g.input("b", {4, 3});
  const ValueId y = g.value("y", {4, 3});
  g.op<ResidualAddOp>({a, b}, {y}, {}, 12);
  g.finish(y);
  g.forward();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(g.data(y)[i], g.data(a)[i] + g.data(b)[i]);
  expect_gradients_match(g, kLinearTolerance);
}

TEST(SoftmaxCrossEntropyOpTest, GradientsMatchFiniteDifferences) {
  OpGraph g;
  const ValueId logits = g.input("logits", {4, 7});
  const ValueId loss = g.value("loss", {1});
  g.op<SoftmaxCrossEntropyOp>({logits}, {loss}, {}, 4, 7);
  g.finish(-1, loss);
  g.ws.targets = {0, 6, 3, 3};
  // The loss is a mean of 4 rows of O(1), so gradients are O(0.1) and noise ~6e-8*2/1e-2 ~ 1e-5:
  // a floor of 1e-3 still leaves noise at ~1e-2 relative at worst.
  expect_gradients_match(g, kSmoothTolerance, 1e-3f);
}

TEST(SoftmaxCrossEntropyOpTest, ForwardMatchesHandComputation) {
  OpGraph g;
  const ValueId logits = g.input("logits", {3, 3});
  const ValueId loss = g.value("loss", {1});
  auto& op = g.op<SoftmaxCrossEntropyOp>({logits}, {loss}, {}, 3, 3);
  g.finish(-1, loss);
  // Row 0: log(e^1 + e^2 + e^3) - 3 = 0.40760596; row 1: log 3 = 1.09861229;
  // row 2 has huge logits: the max-subtraction keeps it finite, loss = 1000 - 0 = 1000 exactly.
  const float values[9] = {1, 2, 3, 0, 0, 0, 1000, 0, -1000};
  std::copy(values, values + 9, g.data(logits));
  g.ws.targets = {2, 0, 1};
  g.forward();
  EXPECT_NEAR(g.data(loss)[0], (0.40760596 + 1.09861229 + 1000.0) / 3.0, 1e-4);
  EXPECT_NEAR(op.probs().data()[2], std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)),
              1e-6);
  EXPECT_NEAR(op.probs().data()[6], 1.0f, 1e-6);
  EXPECT_TRUE(std::isfinite(g.data(loss)[0]));
}

TEST(SoftmaxCrossEntropyOpTest, RejectsOutOfRangeTargets) {
  OpGraph g;
  const ValueId logits = g.input("logits", {2, 3});
  const ValueId loss = g.value("loss", {1});
  g.op<SoftmaxCrossEntropyOp>({logits}, {loss}, {}, 2, 3);
  g.finish(-1, loss);
  g.ws.targets = {0, 3};
  EXPECT_THROW(g.forward(), Error);
  g.ws.targets = {-1, 0};
  EXPECT_THROW(g.forward(), Error);
  g.ws.targets = {0};  // wrong count
  EXPECT_THROW(g.forward(), Error);
}

TEST(EmbeddingOpTest, GradientsAndForward) {
  OpGraph g;
  const ValueId x = g.value("x", {2, 3, 4});
  const ParamId wte = g.param("wte", {5, 4}, 0.0f, 1.0f), wpe = g.param("wpe", {3, 4}, 0.0f, 1.0f);
  g.op<EmbeddingOp>({}, {x}, {wte, wpe}, 2, 3, 4);
  g.finish(x);
  g.ws.tokens = {1, 4, 1, 0, 2, 4};  // repeated tokens exercise the scatter-add
  g.forward();
  for (int row = 0; row < 6; ++row)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(g.data(x)[row * 4 + c], g.params[wte].value.data()[g.ws.tokens[row] * 4 + c] +
                                            g.params[wpe].value.data()[(row % 3) * 4 + c]);
  expect_gradients_match(g, kLinearTolerance);
  g.params.zero_grads();
  g.executor->backward(g.ws);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(g.params[wte].grad.data()[3 * 4 + c], 0.0f);  // unused id
  g.ws.tokens[2] = 5;
  EXPECT_THROW(g.forward(), Error);
}

TEST(LayerNormOpTest, GradientsMatchFiniteDifferences) {
  OpGraph g;
  const ValueId x = g.input("x", {5, 8});
  const ValueId y = g.value("y", {5, 8});
  const ParamId w = g.param("w", {8}, 1.0f, 0.3f), b = g.param("b", {8}, 0.0f, 0.3f);
  g.op<LayerNormOp>({x}, {y}, {w, b}, 5, 8);
  g.finish(y);
  expect_gradients_match(g, kSmoothTolerance);
}

TEST(LayerNormOpTest, ForwardNormalisesEachRow) {
  OpGraph g;
  const ValueId x = g.input("x", {3, 16});
  const ValueId y = g.value("y", {3, 16});
  const ParamId w = g.param("w", {16}, 1.0f, 0.5f), b = g.param("b", {16}, 0.0f, 0.5f);
  g.op<LayerNormOp>({x}, {y}, {w, b}, 3, 16);
  g.finish(y);
  g.forward();
  for (int r = 0; r < 3; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < 16; ++c) mean += g.data(x)[r * 16 + c] / 16.0;
    for (int c = 0; c < 16; ++c) var += std::pow(g.data(x)[r * 16 + c] - mean, 2) / 16.0;
    for (int c = 0; c < 16; ++c) {
      const double xhat = (g.data(x)[r * 16 + c] - mean) / std::sqrt(var + 1e-5);
      EXPECT_NEAR(g.data(y)[r * 16 + c],
                  xhat * g.params[w].value.data()[c] + g.params[b].value.data()[c], 1e-5);
    }
  }
}

TEST(GeluOpTest, GradientsAndKnownValues) {
  OpGraph g;
  const ValueId x = g.input("x", {40});
  const ValueId y = g.value("y", {40});
  g.op<GeluOp>({x}, {y}, {}, 40);
  g.finish(y);
  g.data(x)[0] = 1.0f;
  g.data(x)[1] = 0.0f;
  g.data(x)[2] = -3.0f;
  g.forward();
  EXPECT_NEAR(g.data(y)[0], 0.8411920f, 1e-6);  // GPT-2 tanh-GELU at 1
  EXPECT_EQ(g.data(y)[1], 0.0f);
  EXPECT_NEAR(g.data(y)[2], -0.0036374f, 1e-6);
  expect_gradients_match(g, kSmoothTolerance);
}

TEST(GeluOpTest, MatchesExactFormulaOnAGrid) {
  // The shared helpers (vectorisable exp inside) against the tanh formula in double precision,
  // over a range that covers the exp clamp; then the op's loops against the helpers.
  const auto exact = [](double v) {
    const double u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    const double t = std::tanh(u);
    const double du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
    return std::make_pair(0.5 * v * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du);
  };
  const int64_t numel = 300001;  // above the op's threshold for parallel loops
  std::vector<float> x(numel), y(numel), dx(numel, 0.0f), dy(numel, 1.0f);
  for (int64_t i = 0; i < numel; ++i) x[i] = -15.0f + 30.0f * i / (numel - 1);
  for (int64_t i = 0; i < numel; ++i) {
    const auto [value, grad] = exact(x[i]);
    ASSERT_NEAR(gelu_tanh(x[i]), value, 1e-6 * std::max(1.0, std::fabs(value))) << x[i];
    ASSERT_NEAR(gelu_tanh_grad(x[i]), grad, 2e-6 * std::max(1.0, std::fabs(grad))) << x[i];
  }
  gelu_forward(y.data(), x.data(), numel);
  gelu_backward(dx.data(), dy.data(), x.data(), numel);
  for (int64_t i = 0; i < numel; ++i) {
    ASSERT_EQ(y[i], gelu_tanh(x[i])) << x[i];
    ASSERT_EQ(dx[i], gelu_tanh_grad(x[i])) << x[i];
  }
  const float nan = std::nanf("");
  gelu_forward(y.data(), &nan, 1);
  EXPECT_TRUE(std::isnan(y[0]));
}

// Straightforward per-head attention in double, for comparison with the gemm-based op.
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

TEST(CausalSelfAttentionOpTest, GradientsMatchFiniteDifferences) {
  OpGraph g;
  const ValueId qkv = g.input("qkv", {2, 5, 24});
  const ValueId y = g.value("y", {2, 5, 8});
  g.op<CausalSelfAttentionOp>({qkv}, {y}, {}, 2, 5, 8, 2);
  g.finish(y);
  expect_gradients_match(g, kSmoothTolerance);
}

TEST(CausalSelfAttentionOpTest, ForwardMatchesNaiveAttention) {
  const int B = 2, T = 7, C = 12, NH = 3;
  OpGraph g;
  const ValueId qkv = g.input("qkv", {B, T, 3 * C});
  const ValueId y = g.value("y", {B, T, C});
  g.op<CausalSelfAttentionOp>({qkv}, {y}, {}, B, T, C, NH);
  g.finish(y);
  g.forward();
  const std::vector<double> expected = naive_attention(g.data(qkv), B, T, C, NH);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(g.data(y)[i], expected[i], 1e-5) << i;
}

TEST(CausalSelfAttentionOpTest, OutputAtTDoesNotDependOnLaterTokens) {
  const int B = 2, T = 6, C = 8, NH = 2, t0 = 2;
  OpGraph g;
  const ValueId qkv = g.input("qkv", {B, T, 3 * C});
  const ValueId y = g.value("y", {B, T, C});
  g.op<CausalSelfAttentionOp>({qkv}, {y}, {}, B, T, C, NH);
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

TEST(QkNormOpTest, GradientsMatchFiniteDifferences) {
  OpGraph g;
  const ValueId qkv = g.input("qkv", {2, 3, 24});
  const ValueId y = g.value("y", {2, 3, 24});
  std::vector<ParamId> ps = {g.param("qw", {4}, 1.0f, 0.3f), g.param("qb", {4}, 0.0f, 0.3f),
                             g.param("kw", {4}, 1.0f, 0.3f), g.param("kb", {4}, 0.0f, 0.3f)};
  g.op<QkNormOp>({qkv}, {y}, ps, 2, 3, 8, 2);
  g.finish(y);
  expect_gradients_match(g, kSmoothTolerance);
}

TEST(QkNormOpTest, NormalisesQAndKSlicesAndCopiesV) {
  const int C = 8, NH = 2, hd = 4, rows = 3;
  OpGraph g;
  const ValueId qkv = g.input("qkv", {1, rows, 3 * C});
  const ValueId y = g.value("y", {1, rows, 3 * C});
  std::vector<ParamId> ps = {g.param("qw", {hd}, 1.0f, 0.3f), g.param("qb", {hd}, 0.0f, 0.3f),
                             g.param("kw", {hd}, 1.0f, 0.3f), g.param("kb", {hd}, 0.0f, 0.3f)};
  g.op<QkNormOp>({qkv}, {y}, ps, 1, rows, C, NH);
  g.finish(y);
  g.forward();
  for (int r = 0; r < rows; ++r) {
    const float* in = g.data(qkv) + r * 3 * C;
    const float* out = g.data(y) + r * 3 * C;
    for (int c = 2 * C; c < 3 * C; ++c) EXPECT_EQ(out[c], in[c]);
    for (int part = 0; part < 2; ++part)  // q then k
      for (int h = 0; h < NH; ++h) {
        const int at = part * C + h * hd;
        double mean = 0, var = 0;
        for (int i = 0; i < hd; ++i) mean += in[at + i] / static_cast<double>(hd);
        for (int i = 0; i < hd; ++i) var += std::pow(in[at + i] - mean, 2) / hd;
        const float* w = g.params[ps[2 * part]].value.data();
        const float* b = g.params[ps[2 * part + 1]].value.data();
        for (int i = 0; i < hd; ++i)
          EXPECT_NEAR(out[at + i], (in[at + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i], 1e-5);
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
  const ValueId y = g.value("y", {B, T, C});
  g.op<CausalSelfAttentionOp>({qkv}, {y}, {}, B, T, C, NH);
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

TEST(LargeShapeTest, LayerNormAndQkNormGradients) {
  OpGraph ln;
  const ValueId x = ln.input("x", {600, 128});  // rows * C > 65536
  const ValueId y = ln.value("y", {600, 128});
  ln.op<LayerNormOp>({x}, {y}, {ln.param("w", {128}, 1.0f, 0.3f), ln.param("b", {128}, 0.0f, 0.3f)},
                     600, 128);
  ln.finish(y);
  expect_gradients_match(ln, kSmoothTolerance, 1e-2f, kLargeEps);

  OpGraph qk;
  const ValueId qkv = qk.input("qkv", {700, 96});  // tokens * 3C > 65536
  const ValueId out = qk.value("out", {700, 96});
  std::vector<ParamId> ps = {qk.param("qw", {8}, 1.0f, 0.3f), qk.param("qb", {8}, 0.0f, 0.3f),
                             qk.param("kw", {8}, 1.0f, 0.3f), qk.param("kb", {8}, 0.0f, 0.3f)};
  qk.op<QkNormOp>({qkv}, {out}, ps, 700, 1, 32, 4);
  qk.finish(out);
  expect_gradients_match(qk, kSmoothTolerance, 1e-2f, kLargeEps);
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
  std::vector<float> run(bool training, uint64_t seed) {
    g.ws.training = training;
    g.ws.dropout_seed = seed;
    g.forward();
    return std::vector<float>(g.data(y), g.data(y) + g.ws.values[y].numel());
  }
  OpGraph g;
  ValueId x, y;
  DropoutOp* op;
};

TEST(DropoutOpTest, IdentityWhenPIsZeroOrEvaluating) {
  DropoutGraph zero_p(100, 0.0f, 1);
  for (float value : zero_p.run(true, 7)) EXPECT_EQ(value, 1.0f);
  EXPECT_FALSE(zero_p.op->masked());
  DropoutGraph eval(100, 0.5f, 1);
  for (float value : eval.run(false, 7)) EXPECT_EQ(value, 1.0f);
  EXPECT_FALSE(eval.op->masked());
  expect_gradients_match(eval.g, kLinearTolerance);
}

TEST(DropoutOpTest, HalfKeptAndScaledByTwo) {
  const int64_t numel = 100000;  // above the threshold for the parallel loop
  DropoutGraph half(numel, 0.5f, 3);
  const std::vector<float> out = half.run(true, 11);
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
  const std::vector<float> first = a.run(true, 42);
  EXPECT_EQ(first, b.run(true, 42));
  EXPECT_EQ(first, a.run(true, 42));
  EXPECT_NE(first, a.run(true, 43));
  EXPECT_NE(first, other_salt.run(true, 42));
  // Backward reuses the forward mask: gradient checking a masked op needs it to be fixed.
  a.run(true, 42);
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
