// The device plumbing on a GPU: tensors, fills and copies on cuda, parameters initialised to the
// same bits on both devices, the executor's workspace and loss on cuda, and the first op (GELU)
// against its CPU kernel through tests/device_compare_util.h. Skips without a usable device.
#include <gtest/gtest.h>

#include "core/device.h"
#include "cuda_test_util.h"
#include "device_compare_util.h"
#include "model/ops/gelu.h"

namespace ft {
namespace {
TEST(CudaDevice, TensorFillCopyAndViews) {
  FT_SKIP_WITHOUT_GPU();
  Tensor on_device = Tensor::empty({3, 5}, Device::kCuda);
  EXPECT_EQ(on_device.device(), Device::kCuda);
  on_device.fill(2.5f);
  on_device.rows(1, 2).fill(-1.0f);
  const std::vector<float> host = on_device.to_host_vector();
  for (int i = 0; i < 15; ++i) EXPECT_EQ(host[i], i / 5 == 1 ? -1.0f : 2.5f) << i;
  std::vector<float> source(15);
  for (int i = 0; i < 15; ++i) source[i] = static_cast<float>(i);
  Tensor copied = Tensor::wrap(source.data(), {15}).to(Device::kCuda);
  EXPECT_EQ(copied.to_host_vector(), source);
  Tensor device_copy = Tensor::empty({15}, Device::kCuda);
  device_copy.copy_from(copied);
  EXPECT_EQ(device_copy.to_host_vector(), source);
}

TEST(CudaDevice, ParametersInitialiseToTheSameBitsOnBothDevices) {
  FT_SKIP_WITHOUT_GPU();
  auto build = [](ParamStore& params, Device device) {
    params.add("w", {7, 9}, ParamInit::kNormal, 0.02f, true);
    params.add("g", {9}, ParamInit::kOnes, 0.0f, false);
    params.add_buffer("running_var", {9}, ParamInit::kOnes);
    params.allocate(device);
    params.initialize(42);
  };
  ParamStore on_cpu, on_cuda;
  build(on_cpu, Device::kCpu);
  build(on_cuda, Device::kCuda);
  EXPECT_EQ(on_cuda.flat_values().to_host_vector(), on_cpu.flat_values().to_host_vector());
  EXPECT_EQ(on_cuda.flat_buffers().to_host_vector(), on_cpu.flat_buffers().to_host_vector());
  EXPECT_EQ(on_cuda[0].value.device(), Device::kCuda);
}

TEST(CudaDevice, GeluOpMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  auto build = [](Graph& graph, ParamStore&) {
    const ValueId x = graph.add_value("x", {37, 129});
    const ValueId y = graph.add_value("y", {37, 129});
    graph.add_op<GeluOp>("gelu", {x}, {y}, {}, int64_t{37 * 129});
    add_weighted_sum_loss(graph, y, 5);
  };
  const auto cpu = device_compare::run_on(Device::kCpu, build, {});
  const auto cuda = device_compare::run_on(Device::kCuda, build, {});
  // Device tanh/exp and FMA contraction differ from the host by a few ulp.
  device_compare::expect_runs_close(cuda, cpu, 1e-5, 1e-6);
}

}  // namespace
}  // namespace ft
