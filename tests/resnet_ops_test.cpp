// Tests of the ResNet ops: conv2d against a naive direct convolution (forward and backward),
// finite-difference gradient checks of every op, BatchNorm running statistics in both modes, and
// the accumulate (+=) contract of each backward.
#include <cmath>
#include <algorithm>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/batchnorm.h"
#include "model/ops/conv2d.h"
#include "model/ops/global_avg_pool.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

void fill_normal(Tensor& tensor, Rng& rng, float mean = 0.0f, float std = 1.0f) {
  for (int64_t i = 0; i < tensor.numel(); ++i) tensor.data()[i] = mean + std * rng.normal();
}

// One op from value x to value y, closed by a weighted-sum loss so every output element carries a
// distinct gradient.
struct SingleOpGraph {
  ParamStore params;
  Graph graph;
  ValueId x = -1, y = -1;
  Op* op = nullptr;
  std::unique_ptr<Executor> executor;
  Workspace ws;

  SingleOpGraph(const Shape& x_shape, const Shape& y_shape) {
    x = graph.add_value("x", x_shape);
    y = graph.add_value("y", y_shape);
  }
  template <typename OpType, typename... Args>
  OpType& add(std::vector<ParamId> param_ids, Args&&... args) {
    OpType& added = graph.add_op<OpType>("op", {x}, {y}, std::move(param_ids),
                                         std::forward<Args>(args)...);
    op = &added;
    add_weighted_sum_loss(graph, y, /*seed=*/7);
    return added;
  }
  // Allocates and initialises params, makes the workspace, fills x ~ N(0, 1).
  void finish(uint64_t seed) {
    params.allocate();
    params.initialize(seed);
    executor = std::make_unique<Executor>(graph, params);
    ws = executor->make_workspace();
    Rng rng(seed + 1);
    fill_normal(ws.values[x], rng);
  }
  void forward_backward() {
    params.zero_grads();
    executor->forward(ws);
    executor->backward(ws);
  }
};

struct ConvCase {
  int batch, in_channels, out_channels, height, width, kernel, stride, padding;
};

void PrintTo(const ConvCase& c, std::ostream* out) {
  *out << "batch " << c.batch << " in " << c.in_channels << " out " << c.out_channels << " "
       << c.height << "x" << c.width << " kernel " << c.kernel << " stride " << c.stride
       << " padding " << c.padding;
}

// Index helpers for NCHW / OIHW.
int64_t at4(int64_t a, int64_t b, int64_t c, int64_t d, int64_t nb, int64_t nc, int64_t nd) {
  return ((a * nb + b) * nc + c) * nd + d;
}

// Naive direct convolution and its two gradients, in double. Sets out-of-range taps to zero.
struct NaiveConv {
  ConvCase c;
  int out_h, out_w;
  explicit NaiveConv(const ConvCase& conv_case) : c(conv_case) {
    out_h = (c.height + 2 * c.padding - c.kernel) / c.stride + 1;
    out_w = (c.width + 2 * c.padding - c.kernel) / c.stride + 1;
  }
  // Calls visit(x_index, w_index, y_index) for every tap that lands inside x.
  template <typename Visit>
  void for_each_tap(Visit visit) const {
    for (int b = 0; b < c.batch; ++b)
      for (int o = 0; o < c.out_channels; ++o)
        for (int i = 0; i < out_h; ++i)
          for (int j = 0; j < out_w; ++j)
            for (int ch = 0; ch < c.in_channels; ++ch)
              for (int p = 0; p < c.kernel; ++p)
                for (int q = 0; q < c.kernel; ++q) {
                  const int h = i * c.stride + p - c.padding;
                  const int w = j * c.stride + q - c.padding;
                  if (h < 0 || h >= c.height || w < 0 || w >= c.width) continue;
                  visit(at4(b, ch, h, w, c.in_channels, c.height, c.width),
                        at4(o, ch, p, q, c.in_channels, c.kernel, c.kernel),
                        at4(b, o, i, j, c.out_channels, out_h, out_w));
                }
  }
};

// Every case runs on plain layouts and on oneDNN's blocked ones (with reorders).
class ConvTest : public ::testing::TestWithParam<std::tuple<ConvCase, ConvLayout>> {};

TEST_P(ConvTest, ForwardAndBackwardMatchNaiveConvolution) {
  const auto [c, layout] = GetParam();
  const NaiveConv naive(c);
  SingleOpGraph g({c.batch, c.in_channels, c.height, c.width},
                  {c.batch, c.out_channels, naive.out_h, naive.out_w});
  const ParamId weight = g.params.add("weight", {c.out_channels, c.in_channels, c.kernel, c.kernel},
                                      ParamInit::kNormal, 0.5f, true);
  Conv2dOp& op = g.add<Conv2dOp>({weight}, c.batch, c.in_channels, c.out_channels, c.height,
                                 c.width, c.kernel, c.stride, c.padding);
  op.layout = layout;
  ASSERT_EQ(op.out_height(), naive.out_h);
  ASSERT_EQ(op.out_width(), naive.out_w);
  g.finish(11);
  const float* x = g.ws.values[g.x].data();
  const float* w = g.params[weight].value.data();

  g.executor->forward(g.ws);
  if (layout == ConvLayout::kPlain) {
    EXPECT_FALSE(op.uses_blocked_layout());
  } else if (c.in_channels >= 8) {
    EXPECT_TRUE(op.uses_blocked_layout());
  }
  std::vector<double> y(g.ws.values[g.y].numel(), 0.0);
  naive.for_each_tap([&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += double(x[xi]) * w[wi]; });
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(g.ws.values[g.y].data()[i], y[i], 1e-4 * (1.0 + std::fabs(y[i])))
        << "y[" << i << "]";

  // Backward must ADD to gradients already present: pre-fill them with 0.5.
  Tensor dy = Tensor::empty(g.ws.grads[g.y].shape());
  Rng rng(3);
  fill_normal(dy, rng);
  g.ws.grads[g.y].copy_from(dy);
  g.ws.grads[g.x].fill(0.5f);
  g.params[weight].grad.fill(0.5f);
  op.backward(g.ws, g.params);
  std::vector<double> dx(g.ws.grads[g.x].numel(), 0.5), dw(g.params[weight].grad.numel(), 0.5);
  naive.for_each_tap([&](int64_t xi, int64_t wi, int64_t yi) {
    dx[xi] += double(w[wi]) * dy.data()[yi];
    dw[wi] += double(x[xi]) * dy.data()[yi];
  });
  for (size_t i = 0; i < dx.size(); ++i)
    ASSERT_NEAR(g.ws.grads[g.x].data()[i], dx[i], 1e-4 * (1.0 + std::fabs(dx[i])))
        << "dx[" << i << "]";
  for (size_t i = 0; i < dw.size(); ++i)
    ASSERT_NEAR(g.params[weight].grad.data()[i], dw[i], 1e-4 * (1.0 + std::fabs(dw[i])))
        << "dw[" << i << "]";
}

// The loss is linear in each single entry of x or w, so central differences have no truncation
// error at any step: a large eps (0.1) shrinks the float round-off of the loss (~u |L| / eps, about
// 1e-5 here) far below the 1% tolerance, while any indexing bug is an O(1) error.
TEST_P(ConvTest, GradcheckInputAndWeight) {
  const auto [c, layout] = GetParam();
  const NaiveConv naive(c);
  SingleOpGraph g({c.batch, c.in_channels, c.height, c.width},
                  {c.batch, c.out_channels, naive.out_h, naive.out_w});
  const ParamId weight = g.params.add("weight", {c.out_channels, c.in_channels, c.kernel, c.kernel},
                                      ParamInit::kNormal, 0.5f, true);
  g.add<Conv2dOp>({weight}, c.batch, c.in_channels, c.out_channels, c.height, c.width, c.kernel,
                  c.stride, c.padding)
      .layout = layout;
  g.finish(21);
  GradcheckOptions options;
  options.eps = 0.1f;
  const GradcheckReport report = gradcheck(g.graph, g.params, g.ws, {g.x}, options);
  EXPECT_LT(report.max_rel_error, 1e-2f) << report.worst;
  EXPECT_GT(report.max_abs_grad, 0.1f);
  g.forward_backward();
  EXPECT_LT(backward_accumulation_error(*g.op, g.ws, g.params), 1e-5f);
}

const ConvCase kConvCases[] = {
    {2, 3, 4, 7, 6, 3, 1, 1},  // stride 1, padding 1 (same size)
    {2, 3, 4, 7, 6, 3, 1, 0},  // stride 1, padding 0
    {2, 3, 4, 7, 6, 3, 2, 1},  // stride 2, padding 1, odd height
    {2, 3, 4, 8, 8, 3, 2, 0},  // stride 2, padding 0, floor drops a row
    {2, 3, 5, 8, 7, 1, 2, 0},  // the 1x1 downsample shortcut
    {1, 1, 2, 5, 5, 3, 1, 1},  // the stem: one input channel
    // The shapes of a width-4 ResNet at batch 4, where oneDNN may pick other kernels.
    {4, 1, 4, 28, 28, 3, 1, 1},
    {4, 4, 4, 28, 28, 3, 1, 1},
    {4, 4, 8, 28, 28, 3, 2, 1},
    {4, 4, 8, 28, 28, 1, 2, 0},
    {4, 8, 16, 14, 14, 3, 2, 1},
    {4, 16, 16, 7, 7, 3, 1, 1},
};

INSTANTIATE_TEST_SUITE_P(
    StridesAndPaddings, ConvTest,
    ::testing::Combine(::testing::ValuesIn(kConvCases),
                       ::testing::Values(ConvLayout::kPlain, ConvLayout::kBlocked)),
    [](const ::testing::TestParamInfo<std::tuple<ConvCase, ConvLayout>>& info) {
      const ConvCase& c = std::get<0>(info.param);
      return "k" + std::to_string(c.kernel) + "s" + std::to_string(c.stride) + "p" +
             std::to_string(c.padding) + "h" + std::to_string(c.height) + "w" +
             std::to_string(c.width) + "c" + std::to_string(c.in_channels) +
             (std::get<1>(info.param) == ConvLayout::kPlain ? "_plain" : "_blocked");
    });

TEST(Conv2dOp, RejectsKernelLargerThanPaddedInput) {
  EXPECT_THROW(Conv2dOp(1, 1, 1, 2, 2, 5, 1, 1), Error);
  EXPECT_THROW(Conv2dOp(1, 1, 1, 4, 4, 3, 0, 1), Error);
}

TEST(Conv2dOp, SkipsInputGradientWhenNotNeeded) {
  SingleOpGraph g({1, 2, 5, 5}, {1, 3, 5, 5});
  const ParamId weight = g.params.add("weight", {3, 2, 3, 3}, ParamInit::kNormal, 0.5f, true);
  Conv2dOp& op = g.add<Conv2dOp>({weight}, 1, 2, 3, 5, 5, 3, 1, 1);
  op.needs_input_grad = false;
  g.finish(5);
  g.forward_backward();
  float max_dx = 0.0f, max_dw = 0.0f;
  for (int64_t i = 0; i < g.ws.grads[g.x].numel(); ++i)
    max_dx = std::max(max_dx, std::fabs(g.ws.grads[g.x].data()[i]));
  for (int64_t i = 0; i < g.params[weight].grad.numel(); ++i)
    max_dw = std::max(max_dw, std::fabs(g.params[weight].grad.data()[i]));
  EXPECT_EQ(max_dx, 0.0f);
  EXPECT_GT(max_dw, 0.0f);
}

// BatchNorm over [B=4, C=3, 5, 5] with non-trivial gamma and beta.
struct BatchNormGraph : SingleOpGraph {
  static constexpr int kB = 4, kC = 3, kH = 5, kW = 5;
  ParamId weight, bias, running_mean, running_var;
  BatchNorm2dOp* bn;
  explicit BatchNormGraph(float momentum = 0.1f)
      : SingleOpGraph({kB, kC, kH, kW}, {kB, kC, kH, kW}) {
    weight = params.add("weight", {kC}, ParamInit::kNormal, 1.0f, false);
    bias = params.add("bias", {kC}, ParamInit::kNormal, 1.0f, false);
    running_mean = params.add_buffer("running_mean", {kC}, ParamInit::kZeros);
    running_var = params.add_buffer("running_var", {kC}, ParamInit::kOnes);
    bn = &add<BatchNorm2dOp>({weight, bias, running_mean, running_var}, kB, kC, kH, kW, momentum);
    finish(31);
    // Per-channel offsets and scales, so mean and variance differ between channels.
    float* x_data = ws.values[x].data();
    for (int b = 0; b < kB; ++b)
      for (int c = 0; c < kC; ++c)
        for (int i = 0; i < kH * kW; ++i) {
          float& value = x_data[(b * kC + c) * kH * kW + i];
          value = (c + 1.0f) * value + 2.0f * c - 1.0f;
        }
  }
  // Biased and unbiased variance and mean of channel c of x, in double.
  void channel_stats(int c, double& mean, double& var_biased, double& var_unbiased) const {
    const float* x_data = ws.values[x].data();
    const int count = kB * kH * kW;
    double sum = 0.0, squares = 0.0;
    for (int b = 0; b < kB; ++b)
      for (int i = 0; i < kH * kW; ++i) sum += x_data[(b * kC + c) * kH * kW + i];
    mean = sum / count;
    for (int b = 0; b < kB; ++b)
      for (int i = 0; i < kH * kW; ++i) {
        const double d = x_data[(b * kC + c) * kH * kW + i] - mean;
        squares += d * d;
      }
    var_biased = squares / count;
    var_unbiased = squares / (count - 1);
  }
};

// Normalisation makes the loss nonlinear in x (through mean and variance), so the central
// difference has an eps^2 truncation term; with eps = 1e-2 and unit-scale activations it stays
// well under the 2% bound, while dropping the batch-statistics terms of dx gives O(1) errors.
TEST(BatchNorm2dOp, GradcheckTrainingThroughBatchStatistics) {
  BatchNormGraph g;
  g.ws.training = true;
  GradcheckOptions options;
  options.samples_per_tensor = 40;
  const GradcheckReport report = gradcheck(g.graph, g.params, g.ws, {g.x}, options);
  EXPECT_LT(report.max_rel_error, 2e-2f) << report.worst;
  EXPECT_GT(report.max_abs_grad, 0.1f);
  g.forward_backward();
  EXPECT_LT(backward_accumulation_error(*g.op, g.ws, g.params), 1e-5f);
}

TEST(BatchNorm2dOp, TrainingForwardNormalisesAndUpdatesRunningStatistics) {
  const float momentum = 0.25f;
  BatchNormGraph g(momentum);
  g.ws.training = true;
  g.executor->forward(g.ws);
  const int plane = BatchNormGraph::kH * BatchNormGraph::kW;
  for (int c = 0; c < BatchNormGraph::kC; ++c) {
    double mean, var_biased, var_unbiased;
    g.channel_stats(c, mean, var_biased, var_unbiased);
    EXPECT_NEAR(g.params[g.running_mean].value.data()[c], momentum * mean, 1e-5);
    EXPECT_NEAR(g.params[g.running_var].value.data()[c], (1 - momentum) + momentum * var_unbiased,
                1e-4);
    const double gamma = g.params[g.weight].value.data()[c];
    const double beta = g.params[g.bias].value.data()[c];
    for (int b = 0; b < BatchNormGraph::kB; ++b)
      for (int i = 0; i < plane; ++i) {
        const int64_t index = (b * BatchNormGraph::kC + c) * plane + i;
        const double expected =
            gamma * (g.ws.values[g.x].data()[index] - mean) / std::sqrt(var_biased + 1e-5) + beta;
        ASSERT_NEAR(g.ws.values[g.y].data()[index], expected, 1e-4) << "c=" << c << " b=" << b;
      }
  }
}

TEST(BatchNorm2dOp, EvalUsesRunningStatisticsAndLeavesThemAlone) {
  BatchNormGraph g;
  const float means[3] = {0.5f, -1.0f, 2.0f}, vars[3] = {0.25f, 4.0f, 1.5f};
  for (int c = 0; c < 3; ++c) {
    g.params[g.running_mean].value.data()[c] = means[c];
    g.params[g.running_var].value.data()[c] = vars[c];
  }
  g.ws.training = false;
  g.executor->forward(g.ws);
  const int plane = BatchNormGraph::kH * BatchNormGraph::kW;
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(g.params[g.running_mean].value.data()[c], means[c]);
    EXPECT_EQ(g.params[g.running_var].value.data()[c], vars[c]);
    const double gamma = g.params[g.weight].value.data()[c];
    const double beta = g.params[g.bias].value.data()[c];
    for (int b = 0; b < BatchNormGraph::kB; ++b)
      for (int i = 0; i < plane; ++i) {
        const int64_t index = (b * BatchNormGraph::kC + c) * plane + i;
        const double expected =
            gamma * (g.ws.values[g.x].data()[index] - means[c]) / std::sqrt(vars[c] + 1e-5) + beta;
        ASSERT_NEAR(g.ws.values[g.y].data()[index], expected, 1e-4) << "c=" << c << " b=" << b;
      }
  }
  EXPECT_THROW(g.executor->backward(g.ws), Error);
}

// Inputs are kept at least 0.1 from the kink, so +-eps (1e-2) never crosses it and ReLU is exactly
// linear around every checked entry.
TEST(ReluOp, GradcheckAwayFromTheKink) {
  SingleOpGraph g({3, 4, 5}, {3, 4, 5});
  g.add<ReluOp>({}, 60);
  g.finish(41);
  float* x = g.ws.values[g.x].data();
  for (int i = 0; i < 60; ++i) x[i] = x[i] >= 0.0f ? x[i] + 0.1f : x[i] - 0.1f;
  g.executor->forward(g.ws);
  int positives = 0;
  for (int i = 0; i < 60; ++i) {
    ASSERT_EQ(g.ws.values[g.y].data()[i], x[i] > 0.0f ? x[i] : 0.0f);
    positives += x[i] > 0.0f;
  }
  ASSERT_GT(positives, 10);
  ASSERT_LT(positives, 50);
  GradcheckOptions options;
  options.samples_per_tensor = 60;
  const GradcheckReport report = gradcheck(g.graph, g.params, g.ws, {g.x}, options);
  EXPECT_LT(report.max_rel_error, 1e-2f) << report.worst;
  EXPECT_EQ(report.entries_checked, 60);
  g.forward_backward();
  EXPECT_LT(backward_accumulation_error(*g.op, g.ws, g.params), 1e-6f);
}

TEST(GlobalAvgPoolOp, ForwardIsThePlaneMeanAndGradchecks) {
  SingleOpGraph g({2, 3, 4, 5}, {2, 3});
  g.add<GlobalAvgPoolOp>({}, 2, 3, 4, 5);
  g.finish(51);
  g.executor->forward(g.ws);
  for (int p = 0; p < 6; ++p) {
    double sum = 0.0;
    for (int i = 0; i < 20; ++i) sum += g.ws.values[g.x].data()[p * 20 + i];
    EXPECT_NEAR(g.ws.values[g.y].data()[p], sum / 20.0, 1e-6);
  }
  GradcheckOptions options;
  options.samples_per_tensor = 120;
  const GradcheckReport report = gradcheck(g.graph, g.params, g.ws, {g.x}, options);
  EXPECT_LT(report.max_rel_error, 1e-2f) << report.worst;
  EXPECT_EQ(report.entries_checked, 120);
  g.forward_backward();
  EXPECT_LT(backward_accumulation_error(*g.op, g.ws, g.params), 1e-6f);
}

}  // namespace
}  // namespace ft
