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
#include <limits>
#include <vector>

#include "tests/op_test_util.h"

namespace ft {
namespace {

using namespace op_test;

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

// row_max (the softmax's shift, vectorised) finds the maximum wherever it lies, at lengths that
// leave vector tails, among negative values, and beside -inf.
TEST(SoftmaxCrossEntropyOpTest, RowMaxFindsTheMaximumAnywhere) {
  for (int64_t n : {1, 2, 15, 16, 17, 33, 256}) {
    for (int64_t at = 0; at < n; at += std::max<int64_t>(1, n / 5)) {
      std::vector<float> row(n);
      for (int64_t i = 0; i < n; ++i) row[i] = -100.0f - static_cast<float>(i % 7);
      row[n - 1 == at ? 0 : n - 1] = -std::numeric_limits<float>::infinity();
      if (n == 1) row[0] = 0.0f;
      row[at] = 1000.0f - static_cast<float>(at);
      EXPECT_EQ(row_max(row.data(), n), row[at]) << "n " << n << ", max at " << at;
    }
  }
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

}  // namespace
}  // namespace ft
