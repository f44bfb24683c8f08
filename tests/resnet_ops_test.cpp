// Tests of the ResNet ops: conv2d against a naive direct convolution (forward and backward),
// finite-difference gradient checks of every op, BatchNorm running statistics in both modes, and
// the accumulate (+=) contract of each backward. The ops store activations channels-last (NHWC);
// every reference here is written in PyTorch's (b, c, h, w) indexing and maps it to storage
// through nhwc_index / nchw_index, so a transposed layout fails like a wrong value.
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

// Index helpers: PyTorch indices (sample, channel, row, column) to storage offsets.
int64_t nchw_index(int64_t b, int64_t c, int64_t h, int64_t w, int64_t channels, int64_t height,
                   int64_t width) {
  return ((b * channels + c) * height + h) * width + w;
}
int64_t nhwc_index(int64_t b, int64_t c, int64_t h, int64_t w, int64_t channels, int64_t height,
                   int64_t width) {
  return ((b * height + h) * width + w) * channels + c;
}
int64_t activation_index(ActivationLayout layout, int64_t b, int64_t c, int64_t h, int64_t w,
                         int64_t channels, int64_t height, int64_t width) {
  return layout == ActivationLayout::kNchw ? nchw_index(b, c, h, w, channels, height, width)
                                           : nhwc_index(b, c, h, w, channels, height, width);
}

// PyTorch's output size along one spatial axis.
int conv_out_size(int size, const ConvCase& c) {
  return (size + 2 * c.padding - c.kernel) / c.stride + 1;
}

// Naive direct convolution and its two gradients, in double. Sets out-of-range taps to zero.
// x is stored in `input_layout`, y in NHWC, w in OIHW.
struct NaiveConv {
  ConvCase c;
  ActivationLayout input_layout;
  int out_h, out_w;
  NaiveConv(const ConvCase& conv_case, ActivationLayout layout)
      : c(conv_case),
        input_layout(layout),
        out_h(conv_out_size(c.height, c)),
        out_w(conv_out_size(c.width, c)) {}
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
                  visit(activation_index(input_layout, b, ch, h, w, c.in_channels, c.height,
                                         c.width),
                        nchw_index(o, ch, p, q, c.in_channels, c.kernel, c.kernel),
                        nhwc_index(b, o, i, j, c.out_channels, out_h, out_w));
                }
  }
};

Shape conv_input_shape(const ConvCase& c, ActivationLayout layout) {
  if (layout == ActivationLayout::kNchw) return {c.batch, c.in_channels, c.height, c.width};
  return {c.batch, c.height, c.width, c.in_channels};
}
Shape conv_output_shape(const ConvCase& c) {
  return {c.batch, conv_out_size(c.height, c), conv_out_size(c.width, c), c.out_channels};
}

// Every case runs with NHWC input (every conv inside a ResNet) and NCHW input (the stem, reading
// the images), and with the forward path forced direct or left automatic (transposed where the
// shape allows: stride 1, padding (K-1)/2, 8+ NHWC input channels).
using ConvParam = std::tuple<ConvCase, ActivationLayout, ConvForwardPath>;
class ConvTest : public ::testing::TestWithParam<ConvParam> {};

bool expect_transposed(const ConvCase& c, ActivationLayout layout, ConvForwardPath path) {
  return path == ConvForwardPath::kAuto && c.stride == 1 && 2 * c.padding == c.kernel - 1 &&
         c.in_channels >= 8 && layout == ActivationLayout::kNhwc;
}

// One Conv2dOp in a SingleOpGraph, configured from the test parameter and finished.
struct ConvGraph : SingleOpGraph {
  ConvCase c;
  NaiveConv naive;
  ParamId weight;
  Conv2dOp* conv;
  ConvGraph(const ConvParam& param, uint64_t seed)
      : SingleOpGraph(conv_input_shape(std::get<0>(param), std::get<1>(param)),
                      conv_output_shape(std::get<0>(param))),
        c(std::get<0>(param)),
        naive(c, std::get<1>(param)) {
    weight = params.add("weight", {c.out_channels, c.in_channels, c.kernel, c.kernel},
                        ParamInit::kNormal, 0.5f, true);
    conv = &add<Conv2dOp>({weight}, c.batch, c.in_channels, c.out_channels, c.height, c.width,
                          c.kernel, c.stride, c.padding);
    conv->input_layout = std::get<1>(param);
    conv->forward_path = std::get<2>(param);
    finish(seed);
  }
};

TEST_P(ConvTest, ForwardAndBackwardMatchNaiveConvolution) {
  const auto [c, layout, path] = GetParam();
  ConvGraph g(GetParam(), 11);
  Conv2dOp& op = *g.conv;
  EXPECT_EQ(op.forward_is_transposed(), expect_transposed(c, layout, path));
  ASSERT_EQ(op.out_height(), g.naive.out_h);
  ASSERT_EQ(op.out_width(), g.naive.out_w);
  ASSERT_EQ(op.input_shape(), conv_input_shape(c, layout));
  const float* x = g.ws.values[g.x].data();
  const float* w = g.params[g.weight].value.data();

  EXPECT_STREQ(op.forward_impl(), "");
  g.executor->forward(g.ws);
  EXPECT_STRNE(op.forward_impl(), "");
  std::vector<double> y(g.ws.values[g.y].numel(), 0.0);
  g.naive.for_each_tap(
      [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += double(x[xi]) * w[wi]; });
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(g.ws.values[g.y].data()[i], y[i], 1e-4 * (1.0 + std::fabs(y[i])))
        << "y[" << i << "]";

  // Backward must ADD to gradients already present: pre-fill them with 0.5.
  Tensor dy = Tensor::empty(g.ws.grads[g.y].shape());
  Rng rng(3);
  fill_normal(dy, rng);
  g.ws.grads[g.y].copy_from(dy);
  g.ws.grads[g.x].fill(0.5f);
  g.params[g.weight].grad.fill(0.5f);
  op.backward(g.ws, g.params);
  std::vector<double> dx(g.ws.grads[g.x].numel(), 0.5), dw(g.params[g.weight].grad.numel(), 0.5);
  g.naive.for_each_tap([&](int64_t xi, int64_t wi, int64_t yi) {
    dx[xi] += double(w[wi]) * dy.data()[yi];
    dw[wi] += double(x[xi]) * dy.data()[yi];
  });
  for (size_t i = 0; i < dx.size(); ++i)
    ASSERT_NEAR(g.ws.grads[g.x].data()[i], dx[i], 1e-4 * (1.0 + std::fabs(dx[i])))
        << "dx[" << i << "]";
  for (size_t i = 0; i < dw.size(); ++i)
    ASSERT_NEAR(g.params[g.weight].grad.data()[i], dw[i], 1e-4 * (1.0 + std::fabs(dw[i])))
        << "dw[" << i << "]";
}

// The loss is linear in each single entry of x or w, so central differences have no truncation
// error at any step: a large eps (0.1) shrinks the float round-off of the loss (~u |L| / eps, about
// 1e-5 here) far below the 1% tolerance, while any indexing bug is an O(1) error.
TEST_P(ConvTest, GradcheckInputAndWeight) {
  ConvGraph g(GetParam(), 21);
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
    {2, 3, 8, 6, 6, 3, 1, 1},  // three-channel images
    // Shapes for the transposed forward: non-square, a 5x5 kernel, a 1x1 kernel, more outputs
    // than inputs and fewer.
    {2, 8, 8, 6, 5, 3, 1, 1},
    {2, 8, 12, 5, 6, 5, 1, 2},
    {2, 16, 8, 5, 5, 1, 1, 0},
    {2, 12, 12, 5, 5, 3, 1, 1},  // channels not a multiple of 8 (resnet_width 12)
};

// NHWC input with both forward paths for every case; NCHW input (the images) only where the
// input is image-like (1 or 3 channels), where the transposed path never applies. oneDNN runs
// NCHW with more channels on slow reference kernels, which only cost test time.
std::vector<ConvParam> conv_params() {
  std::vector<ConvParam> params;
  for (const ConvCase& c : kConvCases) {
    params.emplace_back(c, ActivationLayout::kNhwc, ConvForwardPath::kDirect);
    params.emplace_back(c, ActivationLayout::kNhwc, ConvForwardPath::kAuto);
    if (c.in_channels <= 3)
      params.emplace_back(c, ActivationLayout::kNchw, ConvForwardPath::kDirect);
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(
    StridesAndPaddings, ConvTest, ::testing::ValuesIn(conv_params()),
    [](const ::testing::TestParamInfo<ConvParam>& info) {
      const ConvCase& c = std::get<0>(info.param);
      return "k" + std::to_string(c.kernel) + "s" + std::to_string(c.stride) + "p" +
             std::to_string(c.padding) + "h" + std::to_string(c.height) + "w" +
             std::to_string(c.width) + "c" + std::to_string(c.in_channels) +
             "o" + std::to_string(c.out_channels) +
             (std::get<1>(info.param) == ActivationLayout::kNhwc ? "_nhwc" : "_nchw") +
             (std::get<2>(info.param) == ConvForwardPath::kDirect ? "_direct" : "_auto");
    });

TEST(Conv2dOp, TransposedForwardOnlyWhereItApplies) {
  Conv2dOp strided(1, 8, 8, 6, 6, 3, 2, 1), unpadded(1, 8, 8, 6, 6, 3, 1, 0),
      narrow(1, 4, 8, 6, 6, 3, 1, 1), same(1, 8, 8, 6, 6, 3, 1, 1);
  for (Conv2dOp* op : {&strided, &unpadded, &narrow, &same})
    op->forward_path = ConvForwardPath::kTransposed;
  EXPECT_THROW(strided.forward_is_transposed(), Error);
  EXPECT_THROW(unpadded.forward_is_transposed(), Error);
  EXPECT_THROW(narrow.forward_is_transposed(), Error);
  EXPECT_TRUE(same.forward_is_transposed());
  same.input_layout = ActivationLayout::kNchw;
  EXPECT_THROW(same.forward_is_transposed(), Error);
}

TEST(Conv2dOp, RejectsKernelLargerThanPaddedInput) {
  EXPECT_THROW(Conv2dOp(1, 1, 1, 2, 2, 5, 1, 1), Error);
  EXPECT_THROW(Conv2dOp(1, 1, 1, 4, 4, 3, 0, 1), Error);
}

TEST(Conv2dOp, SkipsInputGradientWhenNotNeeded) {
  SingleOpGraph g({1, 5, 5, 2}, {1, 5, 5, 3});
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

// BatchNorm over NHWC [B=3, H=7, W=7, C] with non-trivial gamma and beta. The 147 rows make one
// full chunk of the reduction and an odd remainder; C = 3 runs only the scalar channel loop,
// C = 11 one 8-channel vector block and a scalar tail of 3.
struct BatchNormGraph : SingleOpGraph {
  static constexpr int kB = 3, kH = 7, kW = 7;
  const int kC;
  ParamId weight, bias, running_mean, running_var;
  BatchNorm2dOp* bn;
  explicit BatchNormGraph(int channels, float momentum = 0.1f)
      : SingleOpGraph({kB, kH, kW, channels}, {kB, kH, kW, channels}), kC(channels) {
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
          float& value = x_data[at(b, c, i)];
          value = (c % 4 + 1.0f) * value + 2.0f * c - 1.0f;
        }
  }
  // Storage offset of sample b, channel c, spatial position i (row-major over H x W).
  int64_t at(int b, int c, int i) const { return nhwc_index(b, c, i / kW, i % kW, kC, kH, kW); }
  // Biased and unbiased variance and mean of channel c of x, in double.
  void channel_stats(int c, double& mean, double& var_biased, double& var_unbiased) const {
    const float* x_data = ws.values[x].data();
    const int count = kB * kH * kW;
    double sum = 0.0, squares = 0.0;
    for (int b = 0; b < kB; ++b)
      for (int i = 0; i < kH * kW; ++i) sum += x_data[at(b, c, i)];
    mean = sum / count;
    for (int b = 0; b < kB; ++b)
      for (int i = 0; i < kH * kW; ++i) {
        const double d = x_data[at(b, c, i)] - mean;
        squares += d * d;
      }
    var_biased = squares / count;
    var_unbiased = squares / (count - 1);
  }
};

class BatchNormTest : public ::testing::TestWithParam<int> {};

// Normalisation makes the loss nonlinear in x (through mean and variance), so the five-point
// difference has an eps^4 truncation term, negligible at eps = 5e-2 for unit-scale activations.
// The larger step matters for round-off: the loss sums ~1600 float outputs (~2e-6 of noise), which
// at eps = 1e-2 is ~4e-4 in the quotient, 40% of the 1e-3 floor; at 5e-2 it is ~7e-5. Dropping
// the batch-statistics terms of dx gives O(1) errors.
TEST_P(BatchNormTest, GradcheckTrainingThroughBatchStatistics) {
  BatchNormGraph g(GetParam());
  g.ws.training = true;
  GradcheckOptions options;
  options.eps = 5e-2f;
  options.samples_per_tensor = 40;
  const GradcheckReport report = gradcheck(g.graph, g.params, g.ws, {g.x}, options);
  EXPECT_LT(report.max_rel_error, 2e-2f) << report.worst;
  EXPECT_GT(report.max_abs_grad, 0.1f);
  g.forward_backward();
  EXPECT_LT(backward_accumulation_error(*g.op, g.ws, g.params), 1e-5f);
}

TEST_P(BatchNormTest, TrainingForwardNormalisesAndUpdatesRunningStatistics) {
  const float momentum = 0.25f;
  BatchNormGraph g(GetParam(), momentum);
  g.ws.training = true;
  g.executor->forward(g.ws);
  const int plane = BatchNormGraph::kH * BatchNormGraph::kW;
  for (int c = 0; c < g.kC; ++c) {
    double mean, var_biased, var_unbiased;
    g.channel_stats(c, mean, var_biased, var_unbiased);
    EXPECT_NEAR(g.params[g.running_mean].value.data()[c], momentum * mean, 1e-5 * (1 + c));
    EXPECT_NEAR(g.params[g.running_var].value.data()[c], (1 - momentum) + momentum * var_unbiased,
                1e-4);
    const double gamma = g.params[g.weight].value.data()[c];
    const double beta = g.params[g.bias].value.data()[c];
    for (int b = 0; b < BatchNormGraph::kB; ++b)
      for (int i = 0; i < plane; ++i) {
        const int64_t index = g.at(b, c, i);
        const double expected =
            gamma * (g.ws.values[g.x].data()[index] - mean) / std::sqrt(var_biased + 1e-5) + beta;
        ASSERT_NEAR(g.ws.values[g.y].data()[index], expected, 1e-4) << "c=" << c << " b=" << b;
      }
  }
}

// Statistics come from one pass over the values, shifted by each channel's first value. With
// activations at 1000 +- 1, E[x^2] - E[x]^2 would leave only float noise (u * 1e6 ~ 0.06 of a
// unit variance); the shifted sums must still give the variance to 1e-3.
TEST_P(BatchNormTest, TrainingStatisticsSurviveALargeMean) {
  BatchNormGraph g(GetParam(), /*momentum=*/1.0f);
  float* x_data = g.ws.values[g.x].data();
  for (int64_t i = 0; i < g.ws.values[g.x].numel(); ++i) x_data[i] += 1000.0f;
  g.ws.training = true;
  g.executor->forward(g.ws);
  for (int c = 0; c < g.kC; ++c) {
    double mean, var_biased, var_unbiased;
    g.channel_stats(c, mean, var_biased, var_unbiased);
    ASSERT_GT(var_unbiased, 0.5);
    EXPECT_NEAR(g.params[g.running_mean].value.data()[c], mean, 1e-3);
    EXPECT_NEAR(g.params[g.running_var].value.data()[c], var_unbiased, 1e-3 * var_unbiased);
  }
}

TEST_P(BatchNormTest, EvalUsesRunningStatisticsAndLeavesThemAlone) {
  BatchNormGraph g(GetParam());
  auto running_mean_of = [](int c) { return 0.5f - 0.7f * c; };
  auto running_var_of = [](int c) { return 0.25f + 0.5f * c; };
  for (int c = 0; c < g.kC; ++c) {
    g.params[g.running_mean].value.data()[c] = running_mean_of(c);
    g.params[g.running_var].value.data()[c] = running_var_of(c);
  }
  g.ws.training = false;
  g.executor->forward(g.ws);
  const int plane = BatchNormGraph::kH * BatchNormGraph::kW;
  for (int c = 0; c < g.kC; ++c) {
    EXPECT_EQ(g.params[g.running_mean].value.data()[c], running_mean_of(c));
    EXPECT_EQ(g.params[g.running_var].value.data()[c], running_var_of(c));
    const double gamma = g.params[g.weight].value.data()[c];
    const double beta = g.params[g.bias].value.data()[c];
    for (int b = 0; b < BatchNormGraph::kB; ++b)
      for (int i = 0; i < plane; ++i) {
        const int64_t index = g.at(b, c, i);
        const double expected = gamma * (g.ws.values[g.x].data()[index] - running_mean_of(c)) /
                                    std::sqrt(running_var_of(c) + 1e-5) +
                                beta;
        ASSERT_NEAR(g.ws.values[g.y].data()[index], expected, 1e-4) << "c=" << c << " b=" << b;
      }
  }
  EXPECT_THROW(g.executor->backward(g.ws), Error);
}

INSTANTIATE_TEST_SUITE_P(Channels, BatchNormTest, ::testing::Values(3, 11),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "c" + std::to_string(info.param);
                         });

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
  const int kB = 2, kC = 3, kH = 4, kW = 5;
  SingleOpGraph g({kB, kH, kW, kC}, {kB, kC});
  g.add<GlobalAvgPoolOp>({}, kB, kC, kH, kW);
  g.finish(51);
  g.executor->forward(g.ws);
  for (int b = 0; b < kB; ++b)
    for (int c = 0; c < kC; ++c) {
      double sum = 0.0;
      for (int h = 0; h < kH; ++h)
        for (int w = 0; w < kW; ++w)
          sum += g.ws.values[g.x].data()[nhwc_index(b, c, h, w, kC, kH, kW)];
      EXPECT_NEAR(g.ws.values[g.y].data()[b * kC + c], sum / (kH * kW), 1e-6) << b << "," << c;
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
