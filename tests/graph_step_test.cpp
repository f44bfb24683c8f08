// The host side of fusion.cuda_graph, on the CPU: the caching allocator's hold (blocks a captured
// graph still uses are never handed out again), the step-control formula the replayed step
// computes on the device (against clip_grad_norm, which uses it too), the optimizer constants a
// replay is given (against what step() applies), and the config checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "core/allocator.h"
#include "core/check.h"
#include "core/rng.h"
#include "kernels/step_control.h"
#include "model/gpt.h"
#include "model/optimizer.h"

namespace ft {
namespace {

TEST(CachingAllocatorHold, BlocksReleasedWhileHoldingAreNotReusedUntilReturned) {
  CachingAllocator allocator;
  void* before = allocator.allocate(4096);
  allocator.release(before, 4096);
  allocator.begin_hold();
  // A block cached before the hold may be taken; freed during the hold, it is set aside.
  void* first = allocator.allocate(4096);
  EXPECT_EQ(first, before);
  allocator.release(first, 4096);
  void* second = allocator.allocate(4096);
  EXPECT_NE(second, first) << "a block released during the hold was handed out again";
  allocator.release(second, 4096);
  const CachingAllocator::HeldBlocks held = allocator.end_hold();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(allocator.stats().bytes_in_use, 2 * 4096u) << "held blocks still count as in use";
  std::set<void*> after;  // nothing cached: both new allocations are fresh
  for (int i = 0; i < 2; ++i) after.insert(allocator.allocate(4096));
  EXPECT_EQ(after.count(first) + after.count(second), 0u);
  for (void* block : after) allocator.release(block, 4096);
  allocator.return_held(held);
  EXPECT_EQ(allocator.stats().bytes_in_use, 0u);
  std::set<void*> reused;
  for (int i = 0; i < 4; ++i) reused.insert(allocator.allocate(4096));
  EXPECT_EQ(reused.count(first) + reused.count(second), 2u) << "returned blocks are cached again";
  for (void* block : reused) allocator.release(block, 4096);
}

TEST(CachingAllocatorHold, HoldsDoNotNest) {
  CachingAllocator allocator;
  allocator.begin_hold();
  EXPECT_THROW(allocator.begin_hold(), Error);
  allocator.end_hold();
  EXPECT_THROW(allocator.end_hold(), Error);
}

std::unique_ptr<ParamStore> gpt_store() {
  auto params = std::make_unique<ParamStore>();
  register_gpt_params(GptShape{2, 2, 32, 16, 256, 0.0f, false}, *params);
  params->allocate();
  params->initialize(5);
  Rng rng(9);
  Tensor& grads = params->flat_grads();
  for (int64_t i = 0; i < grads.numel(); ++i) grads.data()[i] = 0.1f * rng.normal();
  return params;
}

// The replay's clip: finish_step_control's norm and scale give clip_grad_norm's results.
TEST(StepControl, NormAndClipScaleAreClipGradNormsBitForBit) {
  for (const float max_norm : {0.0f, 0.5f, 1e6f}) {
    SCOPED_TRACE(max_norm);
    const auto clipped = gpt_store();
    const auto scaled = gpt_store();
    auto sweep = make_per_tensor_sweep();
    DeviceStepControl control;
    control.max_norm = max_norm;
    control.square_sum = sweep->square_sum(*scaled);
    control.loss = 2.5f;
    finish_step_control(control);
    const float norm = clip_grad_norm(*clipped, max_norm, *sweep);
    EXPECT_EQ(std::memcmp(&control.grad_norm, &norm, sizeof(float)), 0);
    EXPECT_FALSE(step_skipped(control));
    if (max_norm == 0.5f) {
      EXPECT_LT(control.clip_scale, 1.0f) << "the gradients exceed 0.5";
    } else {
      EXPECT_EQ(control.clip_scale, 1.0f);
    }
    // Scaling as the optimizer kernels read each gradient gives clipping's bits.
    const float* in_place = clipped->flat_grads().data();
    const float* unscaled = scaled->flat_grads().data();
    for (int64_t i = 0; i < clipped->flat_grads().numel(); ++i) {
      const float read = unscaled[i] * control.clip_scale;
      ASSERT_EQ(std::memcmp(&read, &in_place[i], sizeof(float)), 0) << "gradient " << i;
    }
  }
}

TEST(StepControl, ANonFiniteLossOrNormDiverges) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  DeviceStepControl control;
  control.max_norm = 1.0f;
  control.square_sum = 4.0;
  control.loss = nan;
  finish_step_control(control);
  EXPECT_TRUE(step_skipped(control));
  control.loss = 1.0f;
  control.square_sum = inf;
  finish_step_control(control);
  EXPECT_TRUE(step_skipped(control));
  EXPECT_EQ(control.clip_scale, 0.0f) << "max_norm / inf, as clip_grad_norm; the step is skipped";
  control.square_sum = 4.0;
  finish_step_control(control);
  EXPECT_FALSE(step_skipped(control));
  EXPECT_EQ(control.grad_norm, 2.0f);
  EXPECT_FLOAT_EQ(control.clip_scale, 1.0f / (2.0f + 1e-6f));
}

// next_step_constants gives the constants the next step() applies: a replay updates as step()
// would. Checked by applying them by hand to a copy and comparing with step()'s result.
void expect_constants_match_step(const OptimizerOptions& options) {
  const auto stepped = gpt_store();
  const auto by_hand = gpt_store();
  auto optimizer = make_optimizer(options, *stepped);
  std::vector<float> exp_avg(by_hand->num_trainable_floats(), 0.0f);
  std::vector<float> exp_avg_sq(exp_avg.size(), 0.0f);
  for (int step = 0; step < 3; ++step) {
    const float lr = 1e-2f * static_cast<float>(step + 1);
    DeviceStepControl control;
    optimizer->next_step_constants(lr, &control);
    for (ParamId id = 0; id < by_hand->size(); ++id) {
      Param& param = (*by_hand)[id];
      if (!param.trainable) continue;
      if (options.name == "adamw")
        adamw_update(param.value.data(), exp_avg.data() + param.offset,
                     exp_avg_sq.data() + param.offset, param.grad.data(), param.value.numel(),
                     control.adamw, param.weight_decay);
      else
        sgd_update(param.value.data(), exp_avg.data() + param.offset, param.grad.data(),
                   param.value.numel(), control.sgd, param.weight_decay);
    }
    optimizer->step(*stepped, lr);
    ASSERT_EQ(std::memcmp(stepped->flat_values().data(), by_hand->flat_values().data(),
                          sizeof(float) * stepped->flat_values().numel()),
              0)
        << options.name << " step " << step + 1;
  }
}

TEST(StepControl, NextStepConstantsAreWhatStepApplies) {
  OptimizerOptions adamw;
  adamw.weight_decay = 0.1f;
  expect_constants_match_step(adamw);
  OptimizerOptions sgd;
  sgd.name = "sgd";
  sgd.weight_decay = 0.01f;
  sgd.nesterov = true;
  expect_constants_match_step(sgd);
}

std::string config_error(const std::vector<std::string>& overrides) {
  try {
    parse_config("model: {arch: gpt}\n", "graph.yaml", overrides);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(CudaGraphConfig, NeedsCudaAndOneMicroBatch) {
  const std::string on_cpu = config_error({"fusion.cuda_graph=true"});
  EXPECT_NE(on_cpu.find("graph.yaml: invalid config: fusion.cuda_graph"), std::string::npos)
      << on_cpu;
  EXPECT_NE(on_cpu.find("requires train.device = cuda"), std::string::npos) << on_cpu;
  const std::string accumulating =
      config_error({"fusion.cuda_graph=true", "train.device=cuda", "train.grad_accum=2"});
  EXPECT_NE(accumulating.find("requires train.grad_accum = 1"), std::string::npos) << accumulating;
  const std::string profiled =
      config_error({"fusion.cuda_graph=true", "train.device=cuda", "train.profile=true"});
  EXPECT_NE(profiled.find("cannot go with train.profile or train.trace"), std::string::npos)
      << profiled;
  EXPECT_NE(config_error({"fusion.cuda_graph=true", "train.device=cuda", "train.trace=t.json"})
                .find("train.trace"),
            std::string::npos);
  EXPECT_EQ(config_error({"fusion.cuda_graph=true", "train.device=cuda"}), "");
  EXPECT_EQ(config_error({"fusion.cuda_graph=false", "train.grad_accum=2"}), "");
}

}  // namespace
}  // namespace ft
