// The choices app/training/device_setup.h and comm/backend_choice.h make without touching a GPU:
// which backend reduces gradients (checked here where no GPU is visible, so every machine "shares"
// zero GPUs) and the start-up refusal of train.device: cuda.
#include "app/training/device_setup.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "comm/backend_choice.h"
#include "core/check.h"

namespace ft {
namespace {

// Rank 0 of `ranks`: each allreduce adds the other ranks' contributions, taken in call order
// from `others` (identical ranks: the local value times ranks - 1, when `others` runs out).
class SameRanks : public Communicator {
 public:
  explicit SameRanks(int ranks) : ranks_(ranks) {}
  std::vector<std::vector<float>> others;
  int rank() const override { return 0; }
  int size() const override { return ranks_; }
  int local_rank() const override { return 0; }
  const char* backend_name() const override { return "same-ranks"; }
  void allreduce(float* buffer, size_t count, const AllreduceOptions&) override {
    if (calls_ < others.size()) {
      for (size_t i = 0; i < count; ++i) buffer[i] += others[calls_][i];
    } else {
      for (size_t i = 0; i < count; ++i) buffer[i] *= static_cast<float>(ranks_);
    }
    ++calls_;
  }
  std::unique_ptr<CommHandle> allreduce_async(float*, size_t, const AllreduceOptions&) override {
    FT_FAIL("not expected");
  }
  void broadcast(float*, size_t, int) override {}
  void barrier() override {}

 private:
  int ranks_;
  size_t calls_ = 0;
};

Config with(const std::string& device, const std::string& backend, bool deterministic = false) {
  Config config;
  config.train.device = device;
  config.comm.backend = backend;
  config.comm.deterministic = deterministic;
  return config;
}

// The choice as the trainer asks for it, from a config.
std::string gradient_backend(const Config& config, Communicator& comm) {
  return choose_gradient_backend(
      {config.train.device, config.comm.backend, config.comm.deterministic}, comm);
}

TEST(DeviceSetup, CpuAlwaysReducesOverMpi) {
  SameRanks comm(2);
  EXPECT_EQ(gradient_backend(with("cpu", "auto"), comm), "mpi");
  EXPECT_EQ(gradient_backend(with("cpu", "mpi"), comm), "mpi");
}

TEST(DeviceSetup, CudaWithoutEnoughGpusFallsBackToMpiOrSaysWhy) {
  SameRanks comm(2);
  EXPECT_EQ(gradient_backend(with("cuda", "mpi"), comm), "mpi");
  if (cuda_unusable_reason("x").empty()) GTEST_SKIP() << "a GPU is visible here";
  // No GPU visible: the ranks share zero GPUs, which NCCL cannot serve.
  EXPECT_EQ(gradient_backend(with("cuda", "auto"), comm), "mpi");
  // Both ranks on one machine (the other has local rank 1), both short of GPUs.
  SameRanks one_machine(2);
  one_machine.others = {{0.0f}, {1.0f}};
  try {
    gradient_backend(with("cuda", "nccl"), one_machine);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("comm.backend: nccl needs one GPU per rank, but 2 ranks share 0 GPU(s)"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("comm.backend: mpi"), std::string::npos) << text;
  }
}

TEST(DeviceSetup, CudaIsRefusedAtStartUpWithoutAGpu) {
  if (cuda_unusable_reason("x").empty()) GTEST_SKIP() << "a GPU is usable here";
  EXPECT_EQ(setup_device(with("cpu", "auto"), 0), Device::kCpu);
  try {
    setup_device(with("cuda", "auto"), 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    const std::string text = error.what();
    EXPECT_EQ(text.rfind("train.device: cuda needs ", 0), 0u) << text;
    EXPECT_NE(text.find("use train.device: cpu on this machine"), std::string::npos) << text;
    EXPECT_EQ(text.find(".cpp"), std::string::npos) << "a source path in a user error: " << text;
  }
}

}  // namespace
}  // namespace ft
