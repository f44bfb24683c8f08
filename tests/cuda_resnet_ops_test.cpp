// The ResNet ops on a GPU against their CPU kernels through tests/device_compare_util.h (every
// value, gradient, parameter gradient, buffer and the loss), and the fused ops against their
// unfused twins, both on cuda. Skips without a usable device.
// Tolerances: elementwise ops (ReLU, add+ReLU, BN inference, pooling) evaluate the same float
// expressions on both devices, up to FMA contraction: rtol and atol 1e-5. Convolutions and batch
// statistics sum in a different order (cuDNN's tiles, our block trees): rtol 1e-4 with an atol of
// 1e-4 for entries that cancel towards zero. Running statistics are compared at rtol 1e-5.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "cuda_test_util.h"
#include "device_compare_util.h"
#include "fusion/ops/add_relu.h"
#include "fusion/ops/batchnorm_relu.h"
#include "fusion/ops/conv_bias.h"
#include "fusion/ops/conv_shortcut.h"
#include "model/ops/batchnorm.h"
#include "model/ops/batchnorm_inference.h"
#include "model/ops/conv2d.h"
#include "model/ops/global_avg_pool.h"
#include "model/ops/relu.h"
#include "model/ops/residual.h"
#include "resnet_device_graphs.h"

namespace ft {
namespace {

using device_compare::DeviceRun;
using device_compare::expect_twins_close;
using device_compare::GraphBuilder;

constexpr double kElementwiseRtol = 1e-5, kElementwiseAtol = 1e-5;
constexpr double kReductionRtol = 1e-4, kReductionAtol = 1e-4;

void expect_cuda_matches_cpu(const GraphBuilder& build, double rtol, double atol) {
  const DeviceRun cpu = device_compare::run_on(Device::kCpu, build, {});
  const DeviceRun cuda = device_compare::run_on(test::kGpu, build, {});
  device_compare::expect_runs_close(cuda, cpu, rtol, atol);
}

// ---- Conv2dOp ----

using test::ConvCase;

class CudaConv2d : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CudaConv2d, MatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(test::conv_builder(GetParam(), DType::kF32), kReductionRtol,
                          kReductionAtol);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaConv2d,
    ::testing::Values(ConvCase{2, 8, 16, 8, 3, 1, 1, false},   // 3x3 "same"
                      ConvCase{2, 8, 16, 9, 3, 2, 1, false},   // 3x3 stride 2, odd size
                      ConvCase{2, 8, 16, 8, 1, 2, 0, false},   // 1x1 downsample
                      ConvCase{3, 5, 7, 6, 1, 1, 0, false},    // 1x1, odd channels
                      ConvCase{2, 16, 16, 7, 3, 1, 2, false},  // padding 2 grows the output
                      ConvCase{2, 3, 16, 10, 3, 1, 1, true},   // the stem: NCHW images
                      ConvCase{2, 1, 8, 10, 3, 2, 1, true}));  // one channel

// Two convolutions read x: the first backward writes its fresh gradient (beta 0), the second
// accumulates (beta 1); add_relu joins them so both outputs carry gradient.
TEST(CudaConv2d, SecondReaderAccumulatesIntoTheInputGradient) {
  FT_SKIP_WITHOUT_GPU();
  auto build = [](Graph& graph, ParamStore& params) {
    const ValueId x = graph.add_value("x", {2, 8, 8, 8});
    const ValueId a = graph.add_value("a", {2, 4, 4, 12});
    const ValueId b = graph.add_value("b", {2, 4, 4, 12});
    const ValueId y = graph.add_value("y", {2, 4, 4, 12});
    const ParamId wa = params.add("a.weight", {12, 8, 3, 3}, ParamInit::kNormal, 0.1f, true);
    const ParamId wb = params.add("b.weight", {12, 8, 1, 1}, ParamInit::kNormal, 0.1f, true);
    graph.add_op<Conv2dOp>("a", {x}, {a}, {wa}, 2, 8, 12, 8, 8, 3, 2, 1);
    graph.add_op<Conv2dOp>("b", {x}, {b}, {wb}, 2, 8, 12, 8, 8, 1, 2, 0);
    graph.add_op<AddReluOp>("join", {a, b}, {y}, {}, int64_t{2 * 4 * 4 * 12});
    add_weighted_sum_loss(graph, y, 4);
  };
  expect_cuda_matches_cpu(build, kReductionRtol, kReductionAtol);
}

// ---- BatchNorm (train, inference, fused with ReLU) ----

struct BatchNormCase {
  int batch, channels, height, width;
};

using test::add_batchnorm_params;

// kind: 0 BatchNorm2dOp, 1 BatchNormReluOp, 2 BatchNorm2dOp + ReluOp (1's twin), 3
// BatchNormInferenceOp, 4 BatchNormInferenceReluOp, 5 BatchNormInferenceOp + ReluOp (4's twin).
GraphBuilder batchnorm_builder(const BatchNormCase& c, int kind) {
  return [c, kind](Graph& graph, ParamStore& params) {
    const Shape shape{c.batch, c.height, c.width, c.channels};
    graph.mode = kind >= 3 ? GraphMode::kEval : GraphMode::kTrain;
    const ValueId x = graph.add_value("x", shape);
    const ValueId y = graph.add_value("y", shape);
    const std::vector<ParamId> ids = add_batchnorm_params(params, c.channels);
    const int64_t numel = shape_numel(shape);
    if (kind == 0) {
      graph.add_op<BatchNorm2dOp>("bn", {x}, {y}, ids, c.batch, c.channels, c.height, c.width,
                                  0.25f);
    } else if (kind == 1) {
      graph.add_op<BatchNormReluOp>("bn", {x}, {y}, ids, c.batch, c.channels, c.height, c.width,
                                    0.25f);
    } else if (kind == 2) {
      const ValueId z = graph.add_value("z", shape);
      graph.add_op<BatchNorm2dOp>("bn", {x}, {z}, ids, c.batch, c.channels, c.height, c.width,
                                  0.25f);
      graph.add_op<ReluOp>("relu", {z}, {y}, {}, numel);
    } else if (kind == 3) {
      graph.add_op<BatchNormInferenceOp>("bn", {x}, {y}, ids, c.batch, c.channels, c.height,
                                         c.width);
    } else if (kind == 4) {
      graph.add_op<BatchNormInferenceReluOp>("bn", {x}, {y}, ids, c.batch, c.channels, c.height,
                                             c.width);
    } else {
      const ValueId z = graph.add_value("z", shape);
      graph.add_op<BatchNormInferenceOp>("bn", {x}, {z}, ids, c.batch, c.channels, c.height,
                                         c.width);
      graph.add_op<ReluOp>("relu", {z}, {y}, {}, numel);
    }
    add_weighted_sum_loss(graph, y, 5);
  };
}

class CudaBatchNorm : public ::testing::TestWithParam<BatchNormCase> {};

TEST_P(CudaBatchNorm, TrainMatchesCpuAndMovesRunningStatisticsAlike) {
  FT_SKIP_WITHOUT_GPU();
  for (int kind : {0, 1}) {
    SCOPED_TRACE(kind == 0 ? "batchnorm2d" : "batchnorm_relu");
    const DeviceRun cpu =
        device_compare::run_on(Device::kCpu, batchnorm_builder(GetParam(), kind), {});
    const DeviceRun cuda =
        device_compare::run_on(test::kGpu, batchnorm_builder(GetParam(), kind), {});
    device_compare::expect_runs_close(cuda, cpu, kReductionRtol, kReductionAtol);
    EXPECT_EQ(
        device_compare::difference("running statistics", cuda.buffers, cpu.buffers, 1e-5, 1e-6),
        "");
  }
}

TEST_P(CudaBatchNorm, InferenceMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  for (int kind : {3, 4}) {
    SCOPED_TRACE(kind == 3 ? "batchnorm_inference" : "batchnorm_inference_relu");
    expect_cuda_matches_cpu(batchnorm_builder(GetParam(), kind), kElementwiseRtol,
                            kElementwiseAtol);
  }
}

TEST_P(CudaBatchNorm, FusedReluMatchesBatchNormThenReluOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  const BatchNormCase c = GetParam();
  expect_twins_close(device_compare::run_on(test::kGpu, batchnorm_builder(c, 1), {}),
                     device_compare::run_on(test::kGpu, batchnorm_builder(c, 2), {}), 1e-5, 1e-6);
  expect_twins_close(device_compare::run_on(test::kGpu, batchnorm_builder(c, 4), {}),
                     device_compare::run_on(test::kGpu, batchnorm_builder(c, 5), {}), 1e-6, 1e-7);
}

// 3 channels: one partly used 32-channel block; 40: two blocks; 140 rows: a full chunk of 128
// and a remainder; 2048 rows: 16 chunks summed in double.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaBatchNorm,
                         ::testing::Values(BatchNormCase{4, 3, 5, 7}, BatchNormCase{4, 40, 5, 7},
                                           BatchNormCase{8, 16, 16, 16}));

// ---- ReLU, add + ReLU, global average pooling ----

TEST(CudaRelu, MatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(
      [](Graph& graph, ParamStore&) {
        const ValueId x = graph.add_value("x", {3, 5, 5, 11});
        const ValueId y = graph.add_value("y", {3, 5, 5, 11});
        graph.add_op<ReluOp>("relu", {x}, {y}, {}, int64_t{3 * 5 * 5 * 11});
        add_weighted_sum_loss(graph, y, 6);
      },
      kElementwiseRtol, kElementwiseAtol);
}

TEST(CudaAddRelu, FreshAndAccumulatedGradientsMatchCpu) {
  FT_SKIP_WITHOUT_GPU();
  // a feeds two add_relus: its gradient is fresh for one and accumulated by the other.
  expect_cuda_matches_cpu(
      [](Graph& graph, ParamStore&) {
        const ValueId a = graph.add_value("a", {4, 33});
        const ValueId b = graph.add_value("b", {4, 33});
        const ValueId c = graph.add_value("c", {4, 33});
        const ValueId u = graph.add_value("u", {4, 33});
        const ValueId v = graph.add_value("v", {4, 33});
        const ValueId y = graph.add_value("y", {4, 33});
        graph.add_op<AddReluOp>("first", {a, b}, {u}, {}, int64_t{4 * 33});
        graph.add_op<AddReluOp>("second", {a, c}, {v}, {}, int64_t{4 * 33});
        graph.add_op<AddReluOp>("join", {u, v}, {y}, {}, int64_t{4 * 33});
        add_weighted_sum_loss(graph, y, 8);
      },
      kElementwiseRtol, kElementwiseAtol);
}

// The unfused twin: ResidualAddOp then ReluOp (ResidualAddOp's CUDA kernel is model/ops/
// residual.cu).
TEST(CudaAddRelu, MatchesResidualAddThenReluOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  auto build = [](bool fused) {
    return [fused](Graph& graph, ParamStore&) {
      const Shape shape{2, 6, 6, 9};
      const ValueId a = graph.add_value("a", shape);
      const ValueId b = graph.add_value("b", shape);
      const ValueId y = graph.add_value("y", shape);
      if (fused) {
        graph.add_op<AddReluOp>("add_relu", {a, b}, {y}, {}, shape_numel(shape));
      } else {
        const ValueId sum = graph.add_value("sum", shape);
        graph.add_op<ResidualAddOp>("add", {a, b}, {sum}, {}, shape_numel(shape));
        graph.add_op<ReluOp>("relu", {sum}, {y}, {}, shape_numel(shape));
      }
      add_weighted_sum_loss(graph, y, 7);
    };
  };
  expect_twins_close(device_compare::run_on(test::kGpu, build(true), {}),
                     device_compare::run_on(test::kGpu, build(false), {}), 1e-6, 1e-7);
}

TEST(CudaGlobalAvgPool, MatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(
      [](Graph& graph, ParamStore&) {
        const ValueId x = graph.add_value("x", {3, 7, 5, 19});
        const ValueId y = graph.add_value("y", {3, 19});
        graph.add_op<GlobalAvgPoolOp>("pool", {x}, {y}, {}, 3, 19, 7, 5);
        add_weighted_sum_loss(graph, y, 9);
      },
      kElementwiseRtol, kElementwiseAtol);
}

// ---- ConvShortcutOp ----

struct ShortcutCase {
  int in_channels, out_channels, size, stride;
};

// fused: ConvShortcutOp; else the two Conv2dOps it replaces. add_relu joins the two branches so
// both carry gradient into one loss.
GraphBuilder shortcut_builder(const ShortcutCase& c, bool fused) {
  return [c, fused](Graph& graph, ParamStore& params) {
    const int out = (c.size - 1) / c.stride + 1;
    const Shape out_shape{2, out, out, c.out_channels};
    const ValueId x = graph.add_value("x", {2, c.size, c.size, c.in_channels});
    const ValueId y3 = graph.add_value("conv1", out_shape);
    const ValueId y1 = graph.add_value("downsample.0", out_shape);
    const ValueId y = graph.add_value("y", out_shape);
    const ParamId wide = params.add("conv1.weight", {c.out_channels, c.in_channels, 3, 3},
                                    ParamInit::kNormal, 0.1f, true);
    const ParamId narrow = params.add("downsample.0.weight", {c.out_channels, c.in_channels, 1, 1},
                                      ParamInit::kNormal, 0.1f, true);
    if (fused) {
      graph.add_op<ConvShortcutOp>("conv1_shortcut", {x}, {y3, y1}, {wide, narrow}, 2,
                                   c.in_channels, c.out_channels, c.size, c.size, c.stride);
    } else {
      graph.add_op<Conv2dOp>("conv1", {x}, {y3}, {wide}, 2, c.in_channels, c.out_channels, c.size,
                             c.size, 3, c.stride, 1);
      graph.add_op<Conv2dOp>("downsample.0", {x}, {y1}, {narrow}, 2, c.in_channels, c.out_channels,
                             c.size, c.size, 1, c.stride, 0);
    }
    graph.add_op<AddReluOp>("join", {y3, y1}, {y}, {}, shape_numel(out_shape));
    add_weighted_sum_loss(graph, y, 10);
  };
}

class CudaConvShortcut : public ::testing::TestWithParam<ShortcutCase> {};

TEST_P(CudaConvShortcut, MatchesCpuAndTheTwoConvolutionsOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  const DeviceRun cpu =
      device_compare::run_on(Device::kCpu, shortcut_builder(GetParam(), true), {});
  const DeviceRun cuda = device_compare::run_on(test::kGpu, shortcut_builder(GetParam(), true), {});
  device_compare::expect_runs_close(cuda, cpu, kReductionRtol, kReductionAtol);
  const DeviceRun unfused =
      device_compare::run_on(test::kGpu, shortcut_builder(GetParam(), false), {});
  device_compare::expect_runs_close(cuda, unfused, kReductionRtol, kReductionAtol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaConvShortcut,
                         ::testing::Values(ShortcutCase{8, 16, 8, 2}, ShortcutCase{5, 12, 9, 2},
                                           ShortcutCase{16, 16, 6, 1}));

// ---- ConvBiasOp (inference: BN folded into the convolution, + residual, + ReLU) ----

struct ConvBiasCase {
  int in_channels, out_channels, size, kernel, stride, padding;
  bool residual, relu;
};

// fused: ConvBiasOp with the BatchNorm parameters; else Conv2dOp -> BatchNormInferenceOp, then
// AddReluOp with the residual, or BatchNormInferenceReluOp, or nothing.
GraphBuilder conv_bias_builder(const ConvBiasCase& c, bool fused) {
  return [c, fused](Graph& graph, ParamStore& params) {
    graph.mode = GraphMode::kEval;
    const int out = (c.size + 2 * c.padding - c.kernel) / c.stride + 1;
    const Shape out_shape{2, out, out, c.out_channels};
    const ValueId x = graph.add_value("x", {2, c.size, c.size, c.in_channels});
    const ValueId residual = c.residual ? graph.add_value("residual", out_shape) : -1;
    const ValueId y = graph.add_value("y", out_shape);
    const ParamId w = params.add("conv.weight", {c.out_channels, c.in_channels, c.kernel, c.kernel},
                                 ParamInit::kNormal, 0.1f, true);
    const std::vector<ParamId> bn = add_batchnorm_params(params, c.out_channels);
    if (fused) {
      ConvBiasSpec spec;
      spec.batch = 2;
      spec.in_channels = c.in_channels;
      spec.out_channels = c.out_channels;
      spec.height = spec.width = c.size;
      spec.kernel = c.kernel;
      spec.stride = c.stride;
      spec.padding = c.padding;
      spec.residual = c.residual;
      spec.relu = c.relu;
      std::vector<ValueId> inputs{x};
      if (c.residual) inputs.push_back(residual);
      graph.add_op<ConvBiasOp>("conv_bias", inputs, {y}, {w, bn[0], bn[1], bn[2], bn[3]}, spec,
                               ConvBiasSource::kBatchNorm);
    } else {
      const ValueId conv = graph.add_value("conv", out_shape);
      graph.add_op<Conv2dOp>("conv", {x}, {conv}, {w}, 2, c.in_channels, c.out_channels, c.size,
                             c.size, c.kernel, c.stride, c.padding);
      if (c.residual) {
        const ValueId z = graph.add_value("z", out_shape);
        graph.add_op<BatchNormInferenceOp>("bn", {conv}, {z}, bn, 2, c.out_channels, out, out);
        graph.add_op<AddReluOp>("add_relu", {z, residual}, {y}, {}, shape_numel(out_shape));
      } else if (c.relu) {
        graph.add_op<BatchNormInferenceReluOp>("bn", {conv}, {y}, bn, 2, c.out_channels, out, out);
      } else {
        graph.add_op<BatchNormInferenceOp>("bn", {conv}, {y}, bn, 2, c.out_channels, out, out);
      }
    }
    add_weighted_sum_loss(graph, y, 11);
  };
}

class CudaConvBias : public ::testing::TestWithParam<ConvBiasCase> {};

TEST_P(CudaConvBias, MatchesCpuAndTheUnfusedChainOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  const DeviceRun cpu =
      device_compare::run_on(Device::kCpu, conv_bias_builder(GetParam(), true), {});
  const DeviceRun cuda =
      device_compare::run_on(test::kGpu, conv_bias_builder(GetParam(), true), {});
  device_compare::expect_runs_close(cuda, cpu, kReductionRtol, kReductionAtol);
  const DeviceRun unfused =
      device_compare::run_on(test::kGpu, conv_bias_builder(GetParam(), false), {});
  expect_twins_close(cuda, unfused, kReductionRtol, kReductionAtol);
}

// Residual + ReLU only together: the unfused chain joins them in AddReluOp.
INSTANTIATE_TEST_SUITE_P(Epilogues, CudaConvBias,
                         ::testing::Values(ConvBiasCase{8, 16, 8, 3, 1, 1, false, false},
                                           ConvBiasCase{8, 16, 8, 3, 1, 1, false, true},
                                           ConvBiasCase{16, 16, 8, 3, 1, 1, true, true},
                                           ConvBiasCase{8, 16, 9, 3, 2, 1, false, true},
                                           ConvBiasCase{8, 16, 8, 1, 2, 0, false, false}));

}  // namespace
}  // namespace ft
