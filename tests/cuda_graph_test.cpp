// fusion.cuda_graph: a training step captured as one CUDA graph and replayed gives the eager
// cuda step's results: the same losses, gradient norms and final parameters, for both models, with
// clipping and dropout on; a step that diverges inside a replay is skipped like an eager one.
// Skips without a usable device. Tolerance: the replay runs the same kernels in the same order, and
// both trainers share the process's cuBLASLt plans and cuDNN choices, pinned to deterministic
// algorithms here (set_deterministic_algorithms: no split-K GEMM, deterministic cuDNN only), so
// the two agree to the last bits; 1e-6 relative is a margin for a first run on a new GPU, not an
// expected difference.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "app/training/trainer.h"
#include "core/determinism.h"
#include "cuda_test_util.h"

namespace ft {
namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

Config config_for(const std::string& name, bool cuda_graph, std::vector<std::string> overrides) {
  set_deterministic_algorithms(true);  // every test here compares two runs' bits
  overrides.push_back(std::string("train.device=") + test::kGpuName);
  overrides.push_back("train.steps=12");
  overrides.push_back("optim.warmup_steps=2");  // the presets warm up for 20
  // Emulated on the CPU (tests/cuda_test_util.h) both runs are eager: a graph needs a GPU.
  const bool graph = cuda_graph && !test::kGpuEmulated;
  overrides.push_back("fusion.cuda_graph=" + std::string(graph ? "true" : "false"));
  if (name == "gpt_tiny") overrides.push_back("data.path=" + source_path("data/moby_dick.txt"));
  if (name == "resnet8") overrides.push_back("data.test_limit=512");
  return load_config(source_path("configs/" + name + ".yaml"), overrides);
}

struct StepsRun {
  std::vector<float> losses, norms;
  std::vector<bool> skipped;
  std::vector<float> values;  // the parameters after the last step
};

// An evaluation after step 4 (a replay, with the graph captured at step 3) allocates and frees
// device memory between replays: were a block the graph still writes handed out again, the later
// replays would differ from the eager run.
StepsRun run_steps(const Config& config, int steps) {
  Trainer trainer(config, nullptr);
  StepsRun run;
  for (int i = 0; i < steps; ++i) {
    const StepStats stats = trainer.train_step();
    run.losses.push_back(stats.loss);
    run.norms.push_back(stats.grad_norm);
    run.skipped.push_back(stats.skipped);
    if (i == 3) trainer.evaluate(2);
  }
  run.values = trainer.params().flat_values().to_host_vector();
  return run;
}

void expect_same_run(const StepsRun& graph, const StepsRun& eager) {
  ASSERT_EQ(graph.losses.size(), eager.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_NEAR(graph.losses[i], eager.losses[i], 1e-6 * std::fabs(eager.losses[i]))
        << "step " << i + 1;
    EXPECT_NEAR(graph.norms[i], eager.norms[i], 1e-6 * std::fabs(eager.norms[i]))
        << "step " << i + 1;
    EXPECT_EQ(graph.skipped[i], eager.skipped[i]) << "step " << i + 1;
  }
  ASSERT_EQ(graph.values.size(), eager.values.size());
  double largest = 0.0;
  for (size_t i = 0; i < eager.values.size(); ++i)
    largest = std::max(largest, static_cast<double>(std::fabs(graph.values[i] - eager.values[i])));
  EXPECT_LE(largest, 1e-6) << "largest parameter difference after the last step";
}

class CudaGraphStep : public testing::TestWithParam<const char*> {};

// Clipping at a norm the gradients exceed, so the replayed clip scale is not 1; multi-tensor on
// (the default) and off, so both sweeps' device-control kernels run.
TEST_P(CudaGraphStep, ReplaysMatchTheEagerCudaSteps) {
  FT_SKIP_WITHOUT_GPU();
  for (const char* multi_tensor : {"true", "false"}) {
    SCOPED_TRACE(std::string("multi_tensor ") + multi_tensor);
    const std::vector<std::string> overrides = {
        "optim.grad_clip=0.05", std::string("fusion.horizontal.multi_tensor=") + multi_tensor};
    const StepsRun eager = run_steps(config_for(GetParam(), false, overrides), 8);
    const StepsRun graph = run_steps(config_for(GetParam(), true, overrides), 8);
    expect_same_run(graph, eager);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaGraphStep, testing::Values("gpt_tiny", "resnet8"));

// Dropout masks change every step: the replay reads the step's seed from device memory.
TEST(CudaGraphStepDropout, EachReplayDrawsTheStepsMask) {
  FT_SKIP_WITHOUT_GPU();
  const std::vector<std::string> overrides = {"model.dropout=0.1"};
  expect_same_run(run_steps(config_for("gpt_tiny", true, overrides), 6),
                  run_steps(config_for("gpt_tiny", false, overrides), 6));
}

// SGD at the largest learning rate the config allows, unclipped, blows the model up within a few
// steps (at step 7 on the CPU; as in tests/guard_test.cpp): the replay detects the non-finite
// loss or norm on the device, skips the update there, and the host counts it as an eager step.
TEST(CudaGraphStepDivergence, ADivergedReplayIsSkippedLikeAnEagerStep) {
  FT_SKIP_WITHOUT_GPU();
  const std::vector<std::string> overrides = {"optim.name=sgd", "optim.lr=10", "optim.grad_clip=0",
                                              "train.nan_policy=skip_step",
                                              "train.max_skipped_steps=100"};
  const StepsRun eager = run_steps(config_for("gpt_tiny", false, overrides), 10);
  const StepsRun graph = run_steps(config_for("gpt_tiny", true, overrides), 10);
  ASSERT_EQ(graph.skipped, eager.skipped);
  bool any_skipped = false;
  for (bool skipped : eager.skipped) any_skipped = any_skipped || skipped;
  EXPECT_TRUE(any_skipped) << "SGD at lr 10 should make some step diverge";
}

}  // namespace
}  // namespace ft
