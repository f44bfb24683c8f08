// BatchNormAddReluOp (fusion.vertical.bn_relu's BatchNorm [+ shortcut BatchNorm] -> add -> ReLU)
// against its unfused chain on the CPU, through tests/device_compare_util.h: fresh input
// gradients start as NaN and parameter gradients as noise, so an incomplete overwrite or a lost
// accumulation shows. The two evaluate the same float expressions and sum in the same order, so
// everything must agree bit for bit: values, input and parameter gradients, running statistics
// and the loss. The pass is tested in fusion_resnet_pass_test.cpp, the CUDA kernels in
// cuda_bn_add_relu_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>

#include "batchnorm_add_relu_graphs.h"
#include "core/check.h"

namespace ft {
namespace {

using bn_add_relu_test::builder;
using bn_add_relu_test::Case;
using device_compare::DeviceRun;

class BatchNormAddReluTwin : public ::testing::TestWithParam<Case> {};

TEST_P(BatchNormAddReluTwin, MatchesTheUnfusedChainBitForBit) {
  const DeviceRun fused = device_compare::run_on(Device::kCpu, builder(GetParam(), true), {});
  const DeviceRun unfused = device_compare::run_on(Device::kCpu, builder(GetParam(), false), {});
  device_compare::expect_twins_close(fused, unfused, 0.0, 0.0);
  // The mask must matter: some outputs cut, some passed.
  const auto y = std::find(fused.names.begin(), fused.names.end(), "y") - fused.names.begin();
  const std::vector<float>& values = fused.values[y];
  const auto positives = std::count_if(values.begin(), values.end(), [](float v) { return v > 0; });
  EXPECT_GT(positives, static_cast<long>(values.size() / 5));
  EXPECT_LT(positives, static_cast<long>(4 * values.size() / 5));
}

INSTANTIATE_TEST_SUITE_P(Cases, BatchNormAddReluTwin,
                         ::testing::ValuesIn(bn_add_relu_test::cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return bn_add_relu_test::case_name(info.param);
                         });

TEST(BatchNormAddRelu, BackwardBeforeForwardAndMiswiringAreRefused) {
  Graph graph;
  ParamStore params;
  bn_add_relu_test::builder({2, 4, 3, 3, true, bn_add_relu_test::OtherReader::kNone}, true)(graph,
                                                                                            params);
  params.allocate();
  Op& op = *graph.ops[0];
  ASSERT_EQ(op.op_kind(), OpKind::kBatchNormAddRelu);
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  EXPECT_THROW(op.backward(ws, params), Error);
  op.params.pop_back();  // the shortcut BatchNorm loses its running variance
  EXPECT_THROW(op.forward(ws, params), Error);
  EXPECT_THROW(BatchNormAddReluOp(2, 4, 1, 1, BatchNormSettings{2.0f, 1e-5f}, nullptr), Error);
}

}  // namespace
}  // namespace ft
