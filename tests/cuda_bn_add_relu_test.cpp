// BatchNormAddReluOp on a GPU: against its CPU kernels (tests/device_compare_util.h), and against
// the unfused chain BatchNorm2dOp [+ shortcut BatchNorm2dOp] -> ResidualAddOp -> ReluOp on cuda.
// Batch statistics sum in a different order on the two devices (block trees against vector
// lanes): rtol and atol 1e-4, running statistics 1e-5. On one device the twins run the same
// kernels for the statistics: 1e-5. Skips without a usable device.
#include <gtest/gtest.h>

#include "batchnorm_add_relu_graphs.h"
#include "cuda_test_util.h"

namespace ft {
namespace {

using bn_add_relu_test::builder;
using bn_add_relu_test::Case;
using device_compare::DeviceRun;

class CudaBatchNormAddRelu : public ::testing::TestWithParam<Case> {};

TEST_P(CudaBatchNormAddRelu, MatchesCpuAndTheUnfusedChainOnCuda) {
  FT_SKIP_WITHOUT_GPU();
  const DeviceRun cpu = device_compare::run_on(Device::kCpu, builder(GetParam(), true), {});
  const DeviceRun cuda = device_compare::run_on(test::kGpu, builder(GetParam(), true), {});
  device_compare::expect_runs_close(cuda, cpu, 1e-4, 1e-4);
  EXPECT_EQ(device_compare::difference("running statistics", cuda.buffers, cpu.buffers, 1e-5, 1e-6),
            "");
  const DeviceRun unfused = device_compare::run_on(test::kGpu, builder(GetParam(), false), {});
  device_compare::expect_twins_close(cuda, unfused, 1e-5, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaBatchNormAddRelu,
                         ::testing::ValuesIn(bn_add_relu_test::cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return bn_add_relu_test::case_name(info.param);
                         });

}  // namespace
}  // namespace ft
