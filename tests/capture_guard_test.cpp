// The capture guard (core/capture_guard.h): while a thread captures a CUDA graph, every path that
// would make the host wait throws. Checked here on the CPU: the flag itself, the guarded paths a
// CPU run can reach, and the captured step's sequence (app/training/trainer_graph.cpp: zeroing,
// forward, backward with GradSync's device-path bucket launches, finish, the optimizer step) run
// under the flag after two eager steps, as the trainer runs it, for an eager and a fused GPT. A
// host read or blocking collective added to that sequence fails here before it fails a capture on a
// GPU.
#include "core/capture_guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/grad_sync.h"
#include "core/check.h"
#include "core/rng.h"
#include "fake_stream_communicator.h"
#include "fusion/multi_tensor.h"
#include "fusion/pipeline.h"
#include "model/executor.h"
#include "model/gpt.h"
#include "model/optimizer.h"

namespace ft {
namespace {

TEST(CaptureGuard, FlagIsScopedThreadLocalAndDoesNotNest) {
  EXPECT_FALSE(capturing());
  EXPECT_NO_THROW(require_not_capturing("anything"));
  {
    CapturingScope scope;
    EXPECT_TRUE(capturing());
    EXPECT_THROW(set_capturing(true), Error);
    bool other_thread_capturing = true;
    std::thread([&] { other_thread_capturing = capturing(); }).join();
    EXPECT_FALSE(other_thread_capturing);
    try {
      require_not_capturing("reading the loss");
      FAIL() << "no error while capturing";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("reading the loss makes the host wait"),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_FALSE(capturing());
}

TEST(CaptureGuard, HostReadsThrowWhileCapturing) {
  Tensor tensor = Tensor::zeros({4});
  CapturingScope scope;
  EXPECT_THROW(tensor.to_host_vector(), Error);
  test::HostRanks host(2);
  float value = 1.0f;
  EXPECT_THROW(host.allreduce(&value, 1, {}), Error);
}

// The trainer's captured step on a small GPT, with GradSync on the device path (two ranks of a
// fake NCCL) and the multi-tensor sweep.
class CapturedSequence : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const GptShape shape{2, 2, 32, 16, 64, 0.1f, false};
    graph_ = build_gpt(shape, kBatch, params_);
    params_.allocate();
    params_.initialize(5);
    FusionOptions options;
    options.enabled = GetParam();
    FusionPipeline::standard().run(graph_, params_, options);
    executor_ = std::make_unique<Executor>(graph_, params_);
    ws_ = executor_->make_workspace();
    Rng rng(6);
    for (int i = 0; i < kBatch * shape.seq_len; ++i) {
      ws_.tokens.push_back(static_cast<int32_t>(rng.below(shape.vocab_size)));
      ws_.targets.push_back(static_cast<int32_t>(rng.below(shape.vocab_size)));
    }
    ws_.dropout_seed = 9;
    sweep_ = make_multi_tensor_sweep(params_);
    optimizer_ = make_optimizer(OptimizerOptions(), params_, sweep_);
    GradSyncOptions sync_options;
    sync_options.bucket_mb = 0.01;
    sync_options.first_bucket_mb = 0.005;
    sync_ = std::make_unique<GradSync>(comm_, params_, executor_->grad_ready_order(), sync_options,
                                       &host_);
  }

  // What capture_graph_step runs between begin_capture and end_capture, less its CUDA-only
  // calls (the norm on the device, the step control, the divergence vote's async allreduce).
  void step() {
    sweep_->zero(params_);
    executor_->forward(ws_);
    sync_->begin_backward(true);
    executor_->backward(ws_, [this](ParamId id) { sync_->on_grad_ready(id); });
    sync_->finish(0.5f);
    optimizer_->step(params_, 1e-3f);
  }

  static constexpr int kBatch = 2;
  ParamStore params_;
  Graph graph_;
  std::unique_ptr<Executor> executor_;
  Workspace ws_;
  std::shared_ptr<ParamSweep> sweep_;
  std::unique_ptr<Optimizer> optimizer_;
  test::FakeStreamCommunicator comm_{2};
  test::HostRanks host_{2};
  std::unique_ptr<GradSync> sync_;
};

TEST_P(CapturedSequence, NeverReachesAHostSynchronisingPath) {
  step();  // the trainer's two eager steps before the capture
  step();
  const size_t launches_before = comm_.events.size();
  {
    CapturingScope scope;
    EXPECT_NO_THROW(step());
    // The trainer reads the loss only after the replay; inside the capture it would throw.
    EXPECT_THROW(executor_->loss(ws_), Error);
  }
  EXPECT_GT(comm_.events.size(), launches_before) << "no bucket was launched in the capture";
  for (const std::string& event : comm_.events)
    EXPECT_EQ(event.find("blocking"), std::string::npos) << event;
  EXPECT_TRUE(std::isfinite(executor_->loss(ws_)));
}

// Rebuilding buckets in the observed order broadcasts over the host communicator: that must
// happen in an eager step, never in the captured one.
TEST_P(CapturedSequence, BucketReorderingInACaptureIsCaught) {
  GradSyncOptions options;
  options.reorder_buckets = true;
  sync_ =
      std::make_unique<GradSync>(comm_, params_, executor_->grad_ready_order(), options, &host_);
  CapturingScope scope;
  EXPECT_THROW(step(), Error);
}

INSTANTIATE_TEST_SUITE_P(Graphs, CapturedSequence, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("fused") : std::string("eager");
                         });

}  // namespace
}  // namespace ft
