// The host/device helpers the GPT elementwise and normalisation ops share between their CPU loops
// and their CUDA kernels (kernels/layernorm_math.h, kernels/dropout_math.h), and the host-side
// token grouping of the embedding's CUDA backward, and fast_exp (core/math/fast_exp.h), against
// double-precision or brute-force references. These run on the CPU, so they cover the math the GPU
// kernels call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/math/fast_exp.h"
#include "core/rng.h"
#include "kernels/dropout_math.h"
#include "kernels/layernorm_math.h"
#include "model/ops/embedding.h"

namespace ft {
namespace {

// x = offset + spread * N(0, 1): a large offset makes the mean matter (cancellation).
std::vector<float> noise(int64_t n, uint64_t seed, float offset, float spread) {
  Rng rng(seed);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& value : values) value = offset + spread * rng.normal();
  return values;
}

struct DoubleStats {
  double mean, rstd;
};

DoubleStats double_stats(const std::vector<float>& x) {
  double sum = 0.0;
  for (float value : x) sum += value;
  const double mean = sum / static_cast<double>(x.size());
  double square_sum = 0.0;
  for (float value : x) square_sum += (value - mean) * (value - mean);
  return {mean, 1.0 / std::sqrt(square_sum / static_cast<double>(x.size()) + kLayerNormEps)};
}

// L(x) = sum_i dy_i LN(x)_i in double, for finite differences.
double double_weighted_layernorm(const std::vector<double>& x, const std::vector<float>& dy,
                                 const std::vector<float>& weight, const std::vector<float>& bias) {
  double sum = 0.0;
  for (double value : x) sum += value;
  const double mean = sum / static_cast<double>(x.size());
  double square_sum = 0.0;
  for (double value : x) square_sum += (value - mean) * (value - mean);
  const double rstd = 1.0 / std::sqrt(square_sum / static_cast<double>(x.size()) + kLayerNormEps);
  double loss = 0.0;
  for (size_t i = 0; i < x.size(); ++i)
    loss += dy[i] * ((x[i] - mean) * rstd * weight[i] + bias[i]);
  return loss;
}

double max_abs(const std::vector<float>& values) {
  double largest = 0.0;
  for (float value : values) largest = std::max(largest, std::fabs(static_cast<double>(value)));
  return largest;
}

class LayerNormMathTest : public ::testing::TestWithParam<int64_t> {};

TEST(LayerNormMath, ElementHelpersMatchDouble) {
  const float x = 1.75f, mean = 0.25f, rstd = 2.5f, weight = -0.75f, bias = 0.125f;
  const double xhat = (static_cast<double>(x) - mean) * rstd;
  EXPECT_NEAR(layernorm_xhat(x, mean, rstd), xhat, 1e-6);
  EXPECT_NEAR(layernorm_output(x, mean, rstd, weight, bias), xhat * weight + bias, 1e-6);
  EXPECT_NEAR(layernorm_times_xhat(-3.0f, x, mean, rstd), -3.0 * xhat, 1e-6);
  EXPECT_NEAR(layernorm_squared_deviation(x, mean), 2.25, 1e-6);
  EXPECT_FLOAT_EQ(layernorm_mean(10.0f, 4), 2.5f);
  const float g_mean = 0.3f, g_xhat_mean = -0.2f, dy = 0.9f;
  EXPECT_NEAR(layernorm_input_grad(dy, weight, x, mean, rstd, g_mean, g_xhat_mean),
              rstd * (static_cast<double>(dy) * weight - g_mean - xhat * g_xhat_mean), 1e-6);
  for (float square_sum : {0.0f, 1e-3f, 1.0f, 37.5f, 1e6f})
    for (int64_t n : {1, 32, 129, 768}) {
      const double expected =
          1.0 / std::sqrt(static_cast<double>(square_sum) / static_cast<double>(n) + kLayerNormEps);
      EXPECT_NEAR(layernorm_rstd(square_sum, n, kLayerNormEps), expected, 3e-7 * expected)
          << "square_sum " << square_sum << " n " << n;
    }
}

// A row's statistics and output through layernorm_row_forward (built from the helpers).
TEST_P(LayerNormMathTest, RowForwardMatchesDouble) {
  const int64_t n = GetParam();
  const std::vector<float> x = noise(n, 11 + n, 3.0f, 2.0f);
  const std::vector<float> weight = noise(n, 12 + n, 1.0f, 0.3f);
  const std::vector<float> bias = noise(n, 13 + n, 0.0f, 0.3f);
  std::vector<float> y(static_cast<size_t>(n));
  float mean = 0.0f, rstd = 0.0f;
  layernorm_row_forward(y.data(), &mean, &rstd, x.data(), weight.data(), bias.data(), n,
                        kLayerNormEps);
  const DoubleStats expected = double_stats(x);
  EXPECT_NEAR(mean, expected.mean, 1e-6 * (std::fabs(expected.mean) + 1.0));
  EXPECT_NEAR(rstd, expected.rstd, 1e-5 * expected.rstd);
  for (int64_t i = 0; i < n; ++i) {
    const double reference =
        (x[i] - expected.mean) * expected.rstd * weight[i] + static_cast<double>(bias[i]);
    EXPECT_NEAR(y[i], reference, 2e-5 * (std::fabs(reference) + 1.0)) << "column " << i;
  }
}

// dx against central differences of the double-precision LayerNorm, and dweight, dbias against
// their double sums.
TEST_P(LayerNormMathTest, RowBackwardMatchesDoubleFiniteDifferences) {
  const int64_t n = GetParam();
  const std::vector<float> x = noise(n, 21 + n, -1.5f, 0.7f);
  const std::vector<float> weight = noise(n, 22 + n, 1.0f, 0.3f);
  const std::vector<float> bias = noise(n, 23 + n, 0.0f, 0.3f);
  const std::vector<float> dy = noise(n, 24 + n, 0.0f, 1.0f);
  std::vector<float> y(static_cast<size_t>(n));
  float mean = 0.0f, rstd = 0.0f;
  layernorm_row_forward(y.data(), &mean, &rstd, x.data(), weight.data(), bias.data(), n,
                        kLayerNormEps);
  std::vector<float> dx(static_cast<size_t>(n), 0.5f);  // backward accumulates: += onto 0.5
  layernorm_row_backward_input(dx.data(), dy.data(), x.data(), weight.data(), mean, rstd, n);
  std::vector<float> dweight(static_cast<size_t>(n), 0.0f), dbias(static_cast<size_t>(n), 0.0f);
  layernorm_row_backward_params(dweight.data(), dbias.data(), dy.data(), x.data(), mean, rstd, n);

  std::vector<double> point(x.begin(), x.end());
  std::vector<float> reference_dx(static_cast<size_t>(n));
  const double step = 1e-5;
  for (int64_t i = 0; i < n; ++i) {
    const double saved = point[i];
    point[i] = saved + step;
    const double up = double_weighted_layernorm(point, dy, weight, bias);
    point[i] = saved - step;
    const double down = double_weighted_layernorm(point, dy, weight, bias);
    point[i] = saved;
    reference_dx[i] = static_cast<float>((up - down) / (2.0 * step));
  }
  // The error scale is that of the terms dx cancels, rstd * dy * weight, not of dx itself (at
  // n = 2 dx is nearly 0: xhat = +-1 whatever x is).
  double term_scale = 0.0;
  for (int64_t i = 0; i < n; ++i)
    term_scale = std::max(term_scale, std::fabs(static_cast<double>(rstd) * dy[i] * weight[i]));
  const double scale = std::max(max_abs(reference_dx), term_scale);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(dx[i] - 0.5f, reference_dx[i], 1e-4 * scale) << "column " << i;
  const DoubleStats stats = double_stats(x);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(dweight[i], dy[i] * (x[i] - stats.mean) * stats.rstd, 1e-5) << "column " << i;
    EXPECT_FLOAT_EQ(dbias[i], dy[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Widths, LayerNormMathTest, ::testing::Values(2, 7, 32, 129, 768),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return "n" + std::to_string(info.param);
                         });

// fast_exp over its whole range against double exp: within 3e-7 relative (its fused multiply-adds
// round once each), clamped outside [-87, 88]; a vectorised loop returns the scalar call's bits.
TEST(FastExp, MatchesDoubleExpAndItsVectorLoop) {
  const int64_t count = 400001;
  std::vector<float> x(count), vectorised(count);
  for (int64_t i = 0; i < count; ++i) x[i] = -90.0f + 180.0f * static_cast<float>(i) / (count - 1);
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) vectorised[i] = fast_exp(x[i]);
  double worst = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const float value = fast_exp(x[i]);
    ASSERT_EQ(value, vectorised[i]) << x[i];
    const double clamped = std::min(std::max(static_cast<double>(x[i]), -87.0), 88.0);
    worst = std::max(worst, std::fabs(value - std::exp(clamped)) / std::exp(clamped));
  }
  EXPECT_LT(worst, 3e-7);
}

TEST(DropoutMath, KeepIsTheHashThresholdAndScaleIsInverse) {
  const uint64_t seed = 0x1234abcdull ^ 77;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    int64_t kept = 0;
    const int64_t draws = 200000;
    for (int64_t i = 0; i < draws; ++i) {
      const bool keep = dropout_keep(seed, static_cast<uint64_t>(i), p);
      // The 24-bit uniform, exactly, in double.
      const double uniform = static_cast<double>(hash_u32(seed, i) >> 8) / 16777216.0;
      ASSERT_EQ(keep, uniform >= p) << "element " << i << " p " << p;
      kept += keep ? 1 : 0;
    }
    const double expected = (1.0 - p) * draws;
    const double sigma = std::sqrt(p * (1.0 - p) * draws);
    EXPECT_NEAR(static_cast<double>(kept), expected, 5.0 * sigma) << "p " << p;
    EXPECT_NEAR(dropout_scale(p), 1.0 / (1.0 - static_cast<double>(p)), 2e-7 / (1.0 - p));
  }
  int64_t differs = 0;
  for (int64_t i = 0; i < 1000; ++i)
    differs += dropout_keep(seed, i, 0.5f) != dropout_keep(seed + 1, i, 0.5f) ? 1 : 0;
  EXPECT_GT(differs, 400) << "another seed should draw another mask";
}

TEST(EmbeddingRowsByToken, GroupsRowsAscendingByTokenInAFixedLayout) {
  const int64_t vocab = 11;
  const std::vector<int32_t> tokens = {3, 0, 3, 10, 7, 3, 0, 10, 5, 3, 7, 7};
  const int64_t rows = static_cast<int64_t>(tokens.size());
  const int64_t capacity = embedding_token_capacity(rows, vocab);
  ASSERT_EQ(capacity, vocab);
  const std::vector<int32_t> grouped = embedding_rows_by_token(tokens.data(), rows, vocab);
  // Brute force: every token id with its rows in ascending order, slots past distinct zero.
  std::vector<int32_t> ids, starts, sorted_rows;
  for (int32_t token = 0; token < vocab; ++token) {
    const size_t first = sorted_rows.size();
    for (int64_t row = 0; row < rows; ++row)
      if (tokens[row] == token) sorted_rows.push_back(static_cast<int32_t>(row));
    if (sorted_rows.size() > first) {
      ids.push_back(token);
      starts.push_back(static_cast<int32_t>(first));
    }
  }
  const int32_t distinct = static_cast<int32_t>(ids.size());
  starts.push_back(static_cast<int32_t>(rows));
  ids.resize(capacity, 0);
  starts.resize(capacity + 1, 0);
  std::vector<int32_t> expected = {distinct};
  expected.insert(expected.end(), ids.begin(), ids.end());
  expected.insert(expected.end(), starts.begin(), starts.end());
  expected.insert(expected.end(), sorted_rows.begin(), sorted_rows.end());
  EXPECT_EQ(grouped, expected);

  // The size depends only on (rows, vocab): another batch of the same shape fits the same buffer.
  const std::vector<int32_t> one_token(5, 4);
  const std::vector<int32_t> single = embedding_rows_by_token(one_token.data(), 5, vocab);
  EXPECT_EQ(embedding_token_capacity(5, vocab), 5);
  EXPECT_EQ(single, (std::vector<int32_t>{1, 4, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace ft
