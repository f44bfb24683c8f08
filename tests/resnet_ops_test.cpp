// Tests of the ResNet conv2d op: forward and both gradients against a naive direct convolution,
// finite-difference gradient checks, and the accumulate (+=) contract of its backward. The ops
// store activations channels-last (NHWC); every reference here is written in PyTorch's
// (b, c, h, w) indexing and maps it to storage through nhwc_index / nchw_index, so a transposed
// layout fails like a wrong value. BatchNorm, ReLU and pooling are in resnet_norm_test.cpp.
#include "tests/resnet_test_util.h"

namespace ft {
namespace {

using namespace resnet_test;

struct ConvCase {
  int batch, in_channels, out_channels, height, width, kernel, stride, padding;
};

void PrintTo(const ConvCase& c, std::ostream* out) {
  *out << "batch " << c.batch << " in " << c.in_channels << " out " << c.out_channels << " "
       << c.height << "x" << c.width << " kernel " << c.kernel << " stride " << c.stride
       << " padding " << c.padding;
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
                  visit(
                      activation_index(input_layout, b, ch, h, w, c.in_channels, c.height, c.width),
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
// the images), and with the algorithm forced direct or left automatic (Winograd for 3x3 "same"
// NHWC convolutions with 16k channels, else transposed where the shape allows: stride 1, padding
// (K-1)/2, 8+ NHWC input channels).
using ConvParam = std::tuple<ConvCase, ActivationLayout, ConvAlgorithm>;
class ConvTest : public ::testing::TestWithParam<ConvParam> {};

ConvAlgorithm expected_algorithm(const ConvCase& c, ActivationLayout layout,
                                 ConvAlgorithm algorithm) {
  // kMeasure resolves as kOneDnn; its Winograd alternative is chosen (or not) by timing.
  if (algorithm != ConvAlgorithm::kAuto && algorithm != ConvAlgorithm::kOneDnn &&
      algorithm != ConvAlgorithm::kMeasure)
    return algorithm;
  const bool same = c.stride == 1 && 2 * c.padding == c.kernel - 1;
  const bool nhwc = layout == ActivationLayout::kNhwc;
  if (algorithm == ConvAlgorithm::kAuto && same && nhwc && c.kernel == 3 &&
      c.in_channels % 16 == 0 && c.out_channels % 16 == 0)
    return ConvAlgorithm::kWinograd;
  return same && nhwc && c.in_channels >= 8 ? ConvAlgorithm::kTransposed : ConvAlgorithm::kDirect;
}

const char* algorithm_name(ConvAlgorithm algorithm) {
  switch (algorithm) {
    case ConvAlgorithm::kAuto:
      return "auto";
    case ConvAlgorithm::kOneDnn:
      return "onednn";
    case ConvAlgorithm::kDirect:
      return "direct";
    case ConvAlgorithm::kTransposed:
      return "transposed";
    case ConvAlgorithm::kWinograd:
      return "winograd";
    case ConvAlgorithm::kMeasure:
      return "measure";
  }
  return "?";
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
    conv->algorithm = std::get<2>(param);
    finish(seed);
  }
};

TEST_P(ConvTest, ForwardAndBackwardMatchNaiveConvolution) {
  const auto [c, layout, path] = GetParam();
  ConvGraph g(GetParam(), 11);
  Conv2dOp& op = *g.conv;
  EXPECT_EQ(op.resolved_algorithm(), expected_algorithm(c, layout, path));
  ASSERT_EQ(op.out_height(), g.naive.out_h);
  ASSERT_EQ(op.out_width(), g.naive.out_w);
  ASSERT_EQ(op.input_shape(), conv_input_shape(c, layout));
  const float* x = g.ws.values[g.x].data();
  const float* w = g.params[g.weight].value.data();

  EXPECT_STREQ(op.forward_impl(), "");
  g.executor->forward(g.ws);
  EXPECT_STRNE(op.forward_impl(), "");
  // kMeasure times its two candidates, on each pass's first call, where Winograd applies.
  const bool measures = path == ConvAlgorithm::kMeasure && c.in_channels % 16 == 0 &&
                        c.out_channels % 16 == 0 && c.kernel == 3 && c.stride == 1 &&
                        c.padding == 1;
  EXPECT_EQ(op.runtime_choice().rfind("forward ", 0) == 0, measures) << op.runtime_choice();
  std::vector<double> y(g.ws.values[g.y].numel(), 0.0);
  g.naive.for_each_tap([&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += double(x[xi]) * w[wi]; });
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
  EXPECT_EQ(op.runtime_choice().find("; backward ") != std::string::npos, measures)
      << op.runtime_choice();
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
    // Winograd: whole tiles, half-empty edge tiles, more outputs than inputs and fewer.
    {2, 16, 16, 6, 6, 3, 1, 1},
    {2, 16, 32, 7, 5, 3, 1, 1},
    {1, 32, 16, 3, 3, 3, 1, 1},
};

// NHWC input with both forward paths for every case; NCHW input (the images) only where the
// input is image-like (1 or 3 channels), where the transposed path never applies. oneDNN runs
// NCHW with more channels on slow reference kernels, which only cost test time.
std::vector<ConvParam> conv_params() {
  std::vector<ConvParam> params;
  for (const ConvCase& c : kConvCases) {
    params.emplace_back(c, ActivationLayout::kNhwc, ConvAlgorithm::kDirect);
    params.emplace_back(c, ActivationLayout::kNhwc, ConvAlgorithm::kAuto);
    if (c.in_channels % 16 == 0) {  // the oneDNN twin of a Winograd case, and the two timed
      params.emplace_back(c, ActivationLayout::kNhwc, ConvAlgorithm::kOneDnn);
      params.emplace_back(c, ActivationLayout::kNhwc, ConvAlgorithm::kMeasure);
    }
    if (c.in_channels <= 3) params.emplace_back(c, ActivationLayout::kNchw, ConvAlgorithm::kDirect);
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(StridesAndPaddings, ConvTest, ::testing::ValuesIn(conv_params()),
                         [](const ::testing::TestParamInfo<ConvParam>& info) {
                           const ConvCase& c = std::get<0>(info.param);
                           return "k" + std::to_string(c.kernel) + "s" + std::to_string(c.stride) +
                                  "p" + std::to_string(c.padding) + "h" + std::to_string(c.height) +
                                  "w" + std::to_string(c.width) + "c" +
                                  std::to_string(c.in_channels) + "o" +
                                  std::to_string(c.out_channels) +
                                  (std::get<1>(info.param) == ActivationLayout::kNhwc ? "_nhwc"
                                                                                      : "_nchw") +
                                  "_" + algorithm_name(std::get<2>(info.param));
                         });

TEST(Conv2dOp, TransposedForwardOnlyWhereItApplies) {
  Conv2dOp strided(1, 8, 8, 6, 6, 3, 2, 1), unpadded(1, 8, 8, 6, 6, 3, 1, 0),
      narrow(1, 4, 8, 6, 6, 3, 1, 1), same(1, 8, 8, 6, 6, 3, 1, 1);
  for (Conv2dOp* op : {&strided, &unpadded, &narrow, &same})
    op->algorithm = ConvAlgorithm::kTransposed;
  EXPECT_THROW(strided.resolved_algorithm(), Error);
  EXPECT_THROW(unpadded.resolved_algorithm(), Error);
  EXPECT_THROW(narrow.resolved_algorithm(), Error);
  EXPECT_EQ(same.resolved_algorithm(), ConvAlgorithm::kTransposed);
  same.input_layout = ActivationLayout::kNchw;
  EXPECT_THROW(same.resolved_algorithm(), Error);
}

TEST(Conv2dOp, WinogradOnlyWhereItApplies) {
  Conv2dOp strided(1, 16, 16, 6, 6, 3, 2, 1), five(1, 16, 16, 6, 6, 5, 1, 2),
      narrow(1, 8, 16, 6, 6, 3, 1, 1), same(1, 16, 32, 6, 6, 3, 1, 1);
  for (Conv2dOp* op : {&strided, &five, &narrow, &same}) op->algorithm = ConvAlgorithm::kWinograd;
  EXPECT_THROW(strided.resolved_algorithm(), Error);
  EXPECT_THROW(five.resolved_algorithm(), Error);
  EXPECT_THROW(narrow.resolved_algorithm(), Error);
  EXPECT_EQ(same.resolved_algorithm(), ConvAlgorithm::kWinograd);
  same.input_layout = ActivationLayout::kNchw;
  EXPECT_THROW(same.resolved_algorithm(), Error);
  narrow.algorithm = ConvAlgorithm::kAuto;  // falls back to the transposed oneDNN forward
  EXPECT_EQ(narrow.resolved_algorithm(), ConvAlgorithm::kTransposed);
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

}  // namespace
}  // namespace ft
