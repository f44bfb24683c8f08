// Tests of the ResNet BatchNorm2d, ReLU and global average pool ops: finite-difference gradient
// checks, running statistics in train graphs (BatchNorm2dOp) and eval graphs
// (BatchNormInferenceOp), and the accumulate (+=) contract. Activations are channels-last (NHWC);
// references index them through nhwc_index.
#include "model/ops/batchnorm_inference.h"
#include "tests/resnet_test_util.h"

namespace ft {
namespace {

using namespace resnet_test;

// BatchNorm over NHWC [B=3, H=7, W=7, C] with non-trivial gamma and beta: a BatchNorm2dOp in a
// train graph, a BatchNormInferenceOp in an eval graph. The 147 rows make one full chunk of the
// reduction and an odd remainder; C = 3 runs only the scalar channel loop, C = 11 one 8-channel
// vector block and a scalar tail of 3.
struct BatchNormGraph : SingleOpGraph {
  static constexpr int kB = 3, kH = 7, kW = 7;
  const int kC;
  ParamId weight, bias, running_mean, running_var;
  explicit BatchNormGraph(int channels, float momentum = 0.1f, GraphMode mode = GraphMode::kTrain)
      : SingleOpGraph({kB, kH, kW, channels}, {kB, kH, kW, channels}), kC(channels) {
    weight = params.add("weight", {kC}, ParamInit::kNormal, 1.0f, false);
    bias = params.add("bias", {kC}, ParamInit::kNormal, 1.0f, false);
    running_mean = params.add_buffer("running_mean", {kC}, ParamInit::kZeros);
    running_var = params.add_buffer("running_var", {kC}, ParamInit::kOnes);
    graph.mode = mode;
    if (mode == GraphMode::kEval)
      add<BatchNormInferenceOp>({weight, bias, running_mean, running_var}, kB, kC, kH, kW);
    else
      add<BatchNorm2dOp>({weight, bias, running_mean, running_var}, kB, kC, kH, kW, momentum);
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
  g.executor->forward(g.ws);
  for (int c = 0; c < g.kC; ++c) {
    double mean, var_biased, var_unbiased;
    g.channel_stats(c, mean, var_biased, var_unbiased);
    ASSERT_GT(var_unbiased, 0.5);
    EXPECT_NEAR(g.params[g.running_mean].value.data()[c], mean, 1e-3);
    EXPECT_NEAR(g.params[g.running_var].value.data()[c], var_unbiased, 1e-3 * var_unbiased);
  }
}

TEST_P(BatchNormTest, EvalGraphUsesRunningStatisticsAndLeavesThemAlone) {
  BatchNormGraph g(GetParam(), 0.1f, GraphMode::kEval);
  ASSERT_EQ(g.op->op_kind(), OpKind::kBatchNormInference);
  auto running_mean_of = [](int c) { return 0.5f - 0.7f * c; };
  auto running_var_of = [](int c) { return 0.25f + 0.5f * c; };
  for (int c = 0; c < g.kC; ++c) {
    g.params[g.running_mean].value.data()[c] = running_mean_of(c);
    g.params[g.running_var].value.data()[c] = running_var_of(c);
  }
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
  try {
    g.op->backward(g.ws, g.params);
    ADD_FAILURE() << "BatchNormInferenceOp::backward did not throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("eval graph has no backward"), std::string::npos)
        << error.what();
  }
}

// Train graphs always normalise with batch statistics: a second forward on the same input gives
// the same output although the running statistics moved.
TEST_P(BatchNormTest, TrainGraphAlwaysUsesBatchStatistics) {
  BatchNormGraph g(GetParam());
  g.executor->forward(g.ws);
  const Tensor& y = g.ws.values[g.y];
  const std::vector<float> first(y.data(), y.data() + y.numel());
  const float running_mean = g.params[g.running_mean].value.data()[0];
  g.executor->forward(g.ws);
  EXPECT_NE(g.params[g.running_mean].value.data()[0], running_mean);
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.data()[i], first[i]) << i;
}

TEST(BatchNormAccessors, GeometryEpsAndMomentumAreReadable) {
  const BatchNorm2dOp train(2, 5, 3, 4, 0.3f, 1e-3f);
  EXPECT_EQ(train.batch(), 2);
  EXPECT_EQ(train.channels(), 5);
  EXPECT_EQ(train.height(), 3);
  EXPECT_EQ(train.width(), 4);
  EXPECT_FLOAT_EQ(train.momentum(), 0.3f);
  EXPECT_FLOAT_EQ(train.eps(), 1e-3f);
  EXPECT_EQ(train.shape(), (Shape{2, 3, 4, 5}));
  const BatchNormInferenceOp eval(2, 5, 3, 4, 1e-4f);
  EXPECT_EQ(eval.channels(), 5);
  EXPECT_FLOAT_EQ(eval.eps(), 1e-4f);
  EXPECT_EQ(eval.shape(), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(eval.op_kind(), OpKind::kBatchNormInference);
  EXPECT_THROW(BatchNormInferenceOp(2, 5, 3, 4, 0.0f), Error);
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
