// Winograd F(2x2, 3x3) and F(4x4, 3x3) kernels against a direct convolution summed in double:
// forward, backward data (the flipped-kernel convolution) and the weight gradient, on even and odd
// sizes (odd ones leave half-empty edge tiles), overwrite and accumulate, at both vector widths
// (AVX-512 cases skip on CPUs without it).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/ops/conv2d.h"
#include "model/ops/winograd.h"
#include "model/resnet.h"

namespace ft {
namespace {

struct Case {
  int batch, height, width, in_channels, out_channels;
  WinogradTile tile;
  WinogradIsa isa;
};

std::vector<float> random_vector(size_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> values(count);
  for (float& value : values) value = rng.normal();
  return values;
}

int64_t at(const Case& c, int b, int i, int j, int channels, int channel) {
  return ((static_cast<int64_t>(b) * c.height + i) * c.width + j) * channels + channel;
}

// y[b,i,j,o] = sum_{c,p,q} w[o,c,p,q] x[b, i+p-1, j+q-1, c], in double.
std::vector<double> reference_forward(const Case& c, const std::vector<float>& x,
                                      const std::vector<float>& w) {
  std::vector<double> y(static_cast<size_t>(c.batch) * c.height * c.width * c.out_channels, 0.0);
  for (int b = 0; b < c.batch; ++b)
    for (int i = 0; i < c.height; ++i)
      for (int j = 0; j < c.width; ++j)
        for (int o = 0; o < c.out_channels; ++o) {
          double sum = 0;
          for (int p = 0; p < 3; ++p)
            for (int q = 0; q < 3; ++q) {
              const int row = i + p - 1, col = j + q - 1;
              if (row < 0 || row >= c.height || col < 0 || col >= c.width) continue;
              for (int ch = 0; ch < c.in_channels; ++ch)
                sum += static_cast<double>(w[((o * c.in_channels + ch) * 3 + p) * 3 + q]) *
                       x[at(c, b, row, col, c.in_channels, ch)];
            }
          y[at(c, b, i, j, c.out_channels, o)] = sum;
        }
  return y;
}

// Largest |got - want| relative to the largest |want|.
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return worst / scale;
}

// Float32 rounding of sums of up to 9 * 64 products: F2 stays within a few ulps of the largest
// output; F4's transforms (coefficients up to 8 and 1/24) cost about one more digit.
double tolerance(const Case& c) {
  return c.tile == WinogradTile::k2x2 ? 2e-6 : 2e-5;
}

// Runs each case on its vector width's kernels, and restores the default afterwards.
class Winograd : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!winograd_isa_available(GetParam().isa))
      GTEST_SKIP() << "this CPU has no AVX-512 (or the build did not compile those kernels); "
                   << "the AVX2 cases cover it";
    winograd_set_isa(GetParam().isa);
  }
  void TearDown() override { winograd_set_isa(saved_); }

 private:
  WinogradIsa saved_ = winograd_isa();
};

// Runs a scope with `threads` OpenMP threads (ctest sets OMP_NUM_THREADS=1), more than this
// machine's cores so that several threads share the blocks of a call.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

TEST_P(Winograd, ForwardMatchesDirectAndAccumulates) {
  const Case c = GetParam();
  const auto x =
      random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.in_channels, 1);
  const auto w = random_vector(static_cast<size_t>(c.out_channels) * c.in_channels * 9, 2);
  const auto want = reference_forward(c, x, w);
  std::vector<float> u(winograd_weights_numel(c.in_channels, c.out_channels, c.tile));
  winograd_transform_weights(u.data(), w.data(), c.out_channels, c.in_channels, c.tile,
                             WinogradPass::kForward);
  const WinogradShape shape{c.batch, c.height, c.width, c.in_channels, c.out_channels, c.tile};
  std::vector<float> y(want.size(), 1e6f);  // garbage that kOverwrite must replace
  winograd_conv(y.data(), x.data(), u.data(), shape, WinogradWrite::kOverwrite);
  EXPECT_LT(relative_error(y, want), tolerance(c));
  {  // blocks are independent, so threads change no bit
    ScopedThreads threads(3);
    std::vector<float> y_threaded(want.size(), 1e6f);
    winograd_conv(y_threaded.data(), x.data(), u.data(), shape, WinogradWrite::kOverwrite);
    EXPECT_EQ(y_threaded, y);
  }

  const auto base = random_vector(want.size(), 3);
  std::vector<double> want_sum(want.size());
  for (size_t i = 0; i < want.size(); ++i) want_sum[i] = want[i] + base[i];
  std::vector<float> y_sum = base;
  winograd_conv(y_sum.data(), x.data(), u.data(), shape, WinogradWrite::kAccumulate);
  EXPECT_LT(relative_error(y_sum, want_sum), tolerance(c));
}

// dx[b,h,w,c] = sum_{o,p,q} w[o,c,p,q] dy[b, h-p+1, w-q+1, o]: the forward of the transposed case
// (in and out swapped) with the flipped kernel w'[c,o,p,q] = w[o,c,2-p,2-q].
TEST_P(Winograd, BackwardDataMatchesFlippedKernelConvolution) {
  const Case c = GetParam();
  const Case swapped{c.batch, c.height, c.width, c.out_channels, c.in_channels, c.tile, c.isa};
  const auto dy =
      random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.out_channels, 4);
  const auto w = random_vector(static_cast<size_t>(c.out_channels) * c.in_channels * 9, 5);
  std::vector<float> flipped(w.size());
  for (int o = 0; o < c.out_channels; ++o)
    for (int ch = 0; ch < c.in_channels; ++ch)
      for (int tap = 0; tap < 9; ++tap)
        flipped[(ch * c.out_channels + o) * 9 + 8 - tap] = w[(o * c.in_channels + ch) * 9 + tap];
  const auto base =
      random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.in_channels, 6);
  auto want = reference_forward(swapped, dy, flipped);
  for (size_t i = 0; i < want.size(); ++i) want[i] += base[i];

  std::vector<float> u(winograd_weights_numel(c.in_channels, c.out_channels, c.tile));
  winograd_transform_weights(u.data(), w.data(), c.out_channels, c.in_channels, c.tile,
                             WinogradPass::kBackwardData);
  std::vector<float> dx = base;
  winograd_conv(dx.data(), dy.data(), u.data(),
                {c.batch, c.height, c.width, c.out_channels, c.in_channels, c.tile},
                WinogradWrite::kAccumulate);
  EXPECT_LT(relative_error(dx, want), tolerance(c));
}

// dw[o,c,p,q] += sum_{b,i,j} dy[b,i,j,o] x[b, i+p-1, j+q-1, c].
TEST_P(Winograd, WeightGradMatchesCorrelationAndAccumulates) {
  const Case c = GetParam();
  const auto x =
      random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.in_channels, 7);
  const auto dy =
      random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.out_channels, 8);
  const auto base = random_vector(static_cast<size_t>(c.out_channels) * c.in_channels * 9, 9);
  std::vector<double> want(base.begin(), base.end());
  for (int o = 0; o < c.out_channels; ++o)
    for (int ch = 0; ch < c.in_channels; ++ch)
      for (int p = 0; p < 3; ++p)
        for (int q = 0; q < 3; ++q) {
          double sum = 0;
          for (int b = 0; b < c.batch; ++b)
            for (int i = 0; i < c.height; ++i)
              for (int j = 0; j < c.width; ++j) {
                const int row = i + p - 1, col = j + q - 1;
                if (row < 0 || row >= c.height || col < 0 || col >= c.width) continue;
                sum += static_cast<double>(dy[at(c, b, i, j, c.out_channels, o)]) *
                       x[at(c, b, row, col, c.in_channels, ch)];
              }
          want[((o * c.in_channels + ch) * 3 + p) * 3 + q] += sum;
        }
  const WinogradShape shape{c.batch, c.height, c.width, c.in_channels, c.out_channels, c.tile};
  std::vector<float> dw = base;
  winograd_conv_weight_grad(dw.data(), x.data(), dy.data(), shape);
  EXPECT_LT(relative_error(dw, want), 4 * tolerance(c));  // sums over batch x pixels
  // Threads sum their blocks' partial products in thread order: other bits, same bound.
  ScopedThreads threads(3);
  std::vector<float> dw_threaded = base;
  winograd_conv_weight_grad(dw_threaded.data(), x.data(), dy.data(), shape);
  EXPECT_LT(relative_error(dw_threaded, want), 4 * tolerance(c));
}

// Every shape with both variants at both widths: whole tiles, partial edge tiles in either
// direction (odd sizes for F2, sizes not a multiple of 4 for F4), more inputs than outputs and
// fewer, one pixel, more tiles than one block, and 48 channels (AVX-512 GEMMs take 32 columns a
// panel, then 16).
std::vector<Case> cases() {
  const int shapes[][5] = {{2, 8, 8, 16, 16},  {2, 7, 5, 16, 32},   {1, 7, 7, 32, 16},
                           {3, 1, 1, 16, 16},  {2, 14, 14, 64, 64}, {1, 28, 28, 16, 16},
                           {2, 6, 10, 16, 16}, {1, 9, 11, 48, 16},  {1, 10, 6, 16, 48}};
  std::vector<Case> all;
  for (WinogradIsa isa : {WinogradIsa::kAvx2, WinogradIsa::kAvx512})
    for (WinogradTile tile : {WinogradTile::k2x2, WinogradTile::k4x4})
      for (const auto& s : shapes) all.push_back({s[0], s[1], s[2], s[3], s[4], tile, isa});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Winograd, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return std::string(winograd_isa_name(c.isa)) + "_" +
                                  (c.tile == WinogradTile::k2x2 ? "f2_" : "f4_") + "b" +
                                  std::to_string(c.batch) + "_" + std::to_string(c.height) + "x" +
                                  std::to_string(c.width) + "_" + std::to_string(c.in_channels) +
                                  "to" + std::to_string(c.out_channels);
                         });

TEST(WinogradChannels, OnlyMultiplesOf16AreSupportedAndOthersThrow) {
  EXPECT_TRUE(winograd_supports(16, 64));
  EXPECT_FALSE(winograd_supports(8, 16));
  EXPECT_FALSE(winograd_supports(16, 24));
  std::vector<float> buffer(16 * 8 * 4, 0.0f);
  EXPECT_THROW(winograd_conv(buffer.data(), buffer.data(), buffer.data(),
                             {1, 2, 2, 8, 16, WinogradTile::k4x4}, WinogradWrite::kOverwrite),
               Error);
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// A whole resnet8 (width 16, where every 3x3 "same" convolution qualifies) with Winograd and with
// oneDNN on the same parameters and batch: the loss and every parameter gradient agree.
TEST(WinogradResnet, LossAndGradientsMatchOneDnnTwin) {
  ResnetShape shape{1, 16};
  ParamStore params;
  const ResnetParamIds ids = register_resnet_params(shape, params);
  params.allocate();
  params.initialize(3);
  constexpr int kBatch = 4;
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  for (ConvAlgorithm algorithm : {ConvAlgorithm::kAuto, ConvAlgorithm::kOneDnn}) {
    shape.conv_algorithm = algorithm;
    Graph graph = build_resnet_graph(shape, kBatch, ids);
    int winograd_convs = 0;
    for (const auto& op : graph.ops)
      if (auto* conv = dynamic_cast<Conv2dOp*>(op.get()))
        winograd_convs += conv->resolved_algorithm() == ConvAlgorithm::kWinograd;
    // layer1.0.conv1 and .conv2, layer2.0.conv2 and layer3.0.conv2; layer2.0.conv1 and
    // layer3.0.conv1 have stride 2, the shortcuts are 1x1 and the stem has one input channel.
    EXPECT_EQ(winograd_convs, algorithm == ConvAlgorithm::kAuto ? 4 : 0);
    Executor executor(graph, params);
    Workspace ws = executor.make_workspace();
    Rng rng(5);
    Tensor& images = ws.values[graph.input];
    for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = rng.normal();
    for (int b = 0; b < kBatch; ++b) ws.targets.push_back(static_cast<int32_t>(rng.below(10)));
    params.zero_grads();
    executor.forward(ws);
    executor.backward(ws);
    losses.push_back(executor.loss(ws));
    grads.emplace_back(params.flat_grads().data(),
                       params.flat_grads().data() + params.flat_grads().numel());
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-5 * std::abs(losses[1]));
  double worst = 0, scale = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(grads[0][i] - grads[1][i])));
    scale = std::max(scale, static_cast<double>(std::abs(grads[1][i])));
  }
  EXPECT_GT(scale, 1e-3);
  EXPECT_LT(worst, 1e-4 * scale);
}

}  // namespace
}  // namespace ft
