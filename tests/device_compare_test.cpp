// The cpu-against-cuda harness of tests/device_compare_util.h, run cpu against cpu: identical
// runs agree, and a run with a different op is caught, so a CUDA kernel test built on it can fail.
#include <gmock/gmock.h>

#include "device_compare_util.h"
#include "model/ops/gelu.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

device_compare::GraphBuilder activation_graph(bool use_relu) {
  return [use_relu](Graph& graph, ParamStore&) {
    const ValueId x = graph.add_value("x", {4, 33});
    const ValueId y = graph.add_value("y", {4, 33});
    graph.input = -1;  // x is filled with noise as a value no op writes
    if (use_relu)
      graph.add_op<ReluOp>("act", {x}, {y}, {}, int64_t{4 * 33});
    else
      graph.add_op<GeluOp>("act", {x}, {y}, {}, int64_t{4 * 33});
    add_weighted_sum_loss(graph, y, 3);
  };
}

TEST(DeviceCompare, SameGraphOnCpuTwiceAgreesExactly) {
  const auto a = device_compare::run_on(Device::kCpu, activation_graph(false), {});
  const auto b = device_compare::run_on(Device::kCpu, activation_graph(false), {});
  device_compare::expect_runs_close(a, b, 0.0, 0.0);
  EXPECT_NE(a.loss, 0.0f);
  EXPECT_EQ(a.names.size(), 3u);  // x, y, loss
}

TEST(DeviceCompare, DifferentKernelIsCaught) {
  const auto gelu = device_compare::run_on(Device::kCpu, activation_graph(false), {});
  const auto relu = device_compare::run_on(Device::kCpu, activation_graph(true), {});
  const std::vector<std::string> found = device_compare::run_differences(relu, gelu, 1e-3, 1e-3);
  EXPECT_THAT(found, testing::Contains(testing::StartsWith("value y[")));
  EXPECT_THAT(found, testing::Contains(testing::StartsWith("grad of x[")));
  EXPECT_THAT(found, testing::Contains(testing::StartsWith("loss[")));
  EXPECT_THAT(found, testing::Not(testing::Contains(testing::StartsWith("value x["))));
}

}  // namespace
}  // namespace ft
