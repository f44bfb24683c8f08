// Winograd F(2x2, 3x3) kernels against a direct convolution summed in double: forward, backward
// data (the flipped-kernel convolution) and the weight gradient, on even and odd sizes (odd ones
// leave half-empty edge tiles), overwrite and accumulate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "model/ops/winograd.h"

namespace ft {
namespace {

struct Case {
  int batch, height, width, in_channels, out_channels;
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

constexpr double kTolerance = 2e-6;  // float32 rounding of sums of up to 9 * 64 products

class Winograd : public ::testing::TestWithParam<Case> {};

TEST_P(Winograd, ForwardMatchesDirectAndAccumulates) {
  const Case c = GetParam();
  const auto x = random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.in_channels, 1);
  const auto w = random_vector(static_cast<size_t>(c.out_channels) * c.in_channels * 9, 2);
  const auto want = reference_forward(c, x, w);
  std::vector<float> u(winograd_weights_numel(c.in_channels, c.out_channels));
  winograd_transform_weights(u.data(), w.data(), c.out_channels, c.in_channels,
                             WinogradPass::kForward);
  const WinogradShape shape{c.batch, c.height, c.width, c.in_channels, c.out_channels};
  std::vector<float> y(want.size(), 1e6f);  // garbage that kOverwrite must replace
  winograd_conv(y.data(), x.data(), u.data(), shape, WinogradWrite::kOverwrite);
  EXPECT_LT(relative_error(y, want), kTolerance);

  const auto base = random_vector(want.size(), 3);
  std::vector<double> want_sum(want.size());
  for (size_t i = 0; i < want.size(); ++i) want_sum[i] = want[i] + base[i];
  std::vector<float> y_sum = base;
  winograd_conv(y_sum.data(), x.data(), u.data(), shape, WinogradWrite::kAccumulate);
  EXPECT_LT(relative_error(y_sum, want_sum), kTolerance);
}

// dx[b,h,w,c] = sum_{o,p,q} w[o,c,p,q] dy[b, h-p+1, w-q+1, o]: the forward of the transposed case
// (in and out swapped) with the flipped kernel w'[c,o,p,q] = w[o,c,2-p,2-q].
TEST_P(Winograd, BackwardDataMatchesFlippedKernelConvolution) {
  const Case c = GetParam();
  const Case swapped{c.batch, c.height, c.width, c.out_channels, c.in_channels};
  const auto dy = random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.out_channels, 4);
  const auto w = random_vector(static_cast<size_t>(c.out_channels) * c.in_channels * 9, 5);
  std::vector<float> flipped(w.size());
  for (int o = 0; o < c.out_channels; ++o)
    for (int ch = 0; ch < c.in_channels; ++ch)
      for (int tap = 0; tap < 9; ++tap)
        flipped[(ch * c.out_channels + o) * 9 + 8 - tap] = w[(o * c.in_channels + ch) * 9 + tap];
  const auto base = random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.in_channels, 6);
  auto want = reference_forward(swapped, dy, flipped);
  for (size_t i = 0; i < want.size(); ++i) want[i] += base[i];

  std::vector<float> u(winograd_weights_numel(c.in_channels, c.out_channels));
  winograd_transform_weights(u.data(), w.data(), c.out_channels, c.in_channels,
                             WinogradPass::kBackwardData);
  std::vector<float> dx = base;
  winograd_conv(dx.data(), dy.data(), u.data(),
                {c.batch, c.height, c.width, c.out_channels, c.in_channels},
                WinogradWrite::kAccumulate);
  EXPECT_LT(relative_error(dx, want), kTolerance);
}

// dw[o,c,p,q] += sum_{b,i,j} dy[b,i,j,o] x[b, i+p-1, j+q-1, c].
TEST_P(Winograd, WeightGradMatchesCorrelationAndAccumulates) {
  const Case c = GetParam();
  const auto x = random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.in_channels, 7);
  const auto dy = random_vector(static_cast<size_t>(c.batch) * c.height * c.width * c.out_channels, 8);
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
  std::vector<float> dw = base;
  winograd_conv_weight_grad(dw.data(), x.data(), dy.data(),
                            {c.batch, c.height, c.width, c.in_channels, c.out_channels});
  EXPECT_LT(relative_error(dw, want), 4 * kTolerance);  // sums over batch x pixels
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Winograd,
    ::testing::Values(Case{2, 6, 6, 16, 16},   // whole tiles only
                      Case{2, 7, 5, 16, 32},   // half-empty edge tiles in both directions
                      Case{1, 7, 7, 32, 16},   // more inputs than outputs
                      Case{3, 1, 1, 16, 16},   // one pixel: all taps but the centre padding
                      Case{2, 14, 14, 64, 64}, // more tiles than one block
                      Case{1, 28, 28, 16, 16}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return "b" + std::to_string(c.batch) + "_" + std::to_string(c.height) + "x" +
             std::to_string(c.width) + "_" + std::to_string(c.in_channels) + "to" +
             std::to_string(c.out_channels);
    });

TEST(WinogradChannels, OnlyMultiplesOf16AreSupportedAndOthersThrow) {
  EXPECT_TRUE(winograd_supports(16, 64));
  EXPECT_FALSE(winograd_supports(8, 16));
  EXPECT_FALSE(winograd_supports(16, 24));
  std::vector<float> buffer(16 * 8 * 4, 0.0f);
  EXPECT_THROW(winograd_conv(buffer.data(), buffer.data(), buffer.data(), {1, 2, 2, 8, 16},
                             WinogradWrite::kOverwrite),
               Error);
}

}  // namespace
}  // namespace ft
