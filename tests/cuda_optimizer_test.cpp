// The optimizer sweeps on a GPU (model/optimizer.h's per-tensor sweep, fusion/multi_tensor.h's
// Apex-style multi-tensor sweep) against the CPU per-tensor sweep: several AdamW and SGD steps
// with global-norm clipping, zeroing, scaling and the gradient norm. Two stores: gpt_tiny's
// parameters (13 chunks, weight decay on matrices only) and 300 parameters of mixed sizes, some
// above a chunk, which overflow a launch's tensor table several times.
// Tolerances: the elementwise updates differ from the host by a few ulp (nvcc contracts a * b + c
// into FMA), so values and state are compared with rtol 1e-5, atol 1e-7 after 5 steps; the norm
// is summed in double in another order, so it matches the CPU to 1e-12 relative (all terms are
// positive: the CPU lanes' 8,192-term sums bound the error by 9e-13); both cuda norms
// use the same blocks and order, so they agree bitwise; scaling and zeroing are exact.
// Skips without a usable device.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "cuda_test_util.h"
#include "fusion/multi_tensor.h"
#include "model/gpt.h"
#include "model/optimizer.h"

namespace ft {
namespace {

enum class Layout { kGptTiny, kManyTensors };
enum class SweepKind { kPerTensor, kMultiTensor };

std::unique_ptr<ParamStore> make_store(Layout layout, Device device) {
  auto params = std::make_unique<ParamStore>();
  if (layout == Layout::kGptTiny) {
    register_gpt_params(GptShape{4, 4, 128, 64, 256, 0.0f, false}, *params);
  } else {
    for (int i = 0; i < 300; ++i) {
      const int64_t numel = i % 50 == 7 ? 65536 * 2 + 3 * i : 1 + (i * 37) % 900;
      params->add("p" + std::to_string(i), {numel}, ParamInit::kNormal, 0.02f, i % 3 != 0);
    }
    params->add_buffer("buffer", {5}, ParamInit::kOnes);
  }
  params->allocate(device);
  params->initialize(17);
  return params;
}

std::vector<float> random_floats(int64_t count, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = scale * rng.normal();
  return values;
}

void set_grads(ParamStore& params, uint64_t seed) {
  std::vector<float> grads = random_floats(params.num_trainable_floats(), seed, 0.05f);
  params.flat_grads().copy_from(
      Tensor::wrap(grads.data(), {static_cast<int64_t>(grads.size())}, Device::kCpu));
}

std::shared_ptr<ParamSweep> make_sweep(SweepKind kind, const ParamStore& params) {
  return kind == SweepKind::kMultiTensor
             ? std::shared_ptr<ParamSweep>(make_multi_tensor_sweep(params))
             : std::shared_ptr<ParamSweep>(make_per_tensor_sweep());
}

struct Training {
  std::unique_ptr<ParamStore> params;
  std::shared_ptr<ParamSweep> sweep;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<float> norms;
};

// Five steps of clip-then-step with the same gradients on any device and sweep.
Training train(Layout layout, Device device, SweepKind kind, const OptimizerOptions& options) {
  Training run;
  run.params = make_store(layout, device);
  run.sweep = make_sweep(kind, *run.params);
  run.optimizer = make_optimizer(options, *run.params, run.sweep);
  for (int step = 0; step < 5; ++step) {
    set_grads(*run.params, 1000 + step);
    run.norms.push_back(clip_grad_norm(*run.params, 1.0f, *run.sweep));
    run.optimizer->step(*run.params, 1e-2f);
  }
  return run;
}

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < actual.size(); ++i)
    if (!(std::fabs(actual[i] - expected[i]) <= 1e-7f + 1e-5f * std::fabs(expected[i]))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": first at " << first << ": " << (first >= 0 ? actual[first] : 0.0f)
                    << " vs " << (first >= 0 ? expected[first] : 0.0f);
}

void expect_training_matches_cpu(Layout layout, const OptimizerOptions& options) {
  const Training cpu = train(layout, Device::kCpu, SweepKind::kPerTensor, options);
  std::vector<float> cuda_norms;
  for (SweepKind kind : {SweepKind::kPerTensor, SweepKind::kMultiTensor}) {
    const std::string name = kind == SweepKind::kMultiTensor ? "multi-tensor" : "per-tensor";
    Training cuda = train(layout, test::kGpu, kind, options);
    for (size_t s = 0; s < cpu.norms.size(); ++s)
      EXPECT_NEAR(cuda.norms[s], cpu.norms[s], 1e-6 * cpu.norms[s]) << name << " step " << s;
    if (cuda_norms.empty())
      cuda_norms = cuda.norms;
    else
      EXPECT_EQ(cuda.norms, cuda_norms) << "the two cuda sweeps' norms differ";
    expect_close(cuda.params->flat_values().to_host_vector(),
                 cpu.params->flat_values().to_host_vector(), name + " values");
    const auto cuda_slots = cuda.optimizer->state_slots();
    auto cpu_optimizer_slots = cpu.optimizer->state_slots();
    ASSERT_EQ(cuda_slots.size(), cpu_optimizer_slots.size());
    for (size_t k = 0; k < cuda_slots.size(); ++k) {
      EXPECT_EQ(cuda_slots[k].second->device(), test::kGpu) << cuda_slots[k].first;
      expect_close(cuda_slots[k].second->to_host_vector(),
                   cpu_optimizer_slots[k].second->to_host_vector(),
                   name + " " + cuda_slots[k].first);
    }
  }
}

OptimizerOptions adamw_options() {
  OptimizerOptions options;
  options.name = "adamw";
  options.weight_decay = 0.1f;
  return options;
}

OptimizerOptions sgd_options(bool nesterov) {
  OptimizerOptions options;
  options.name = "sgd";
  options.weight_decay = 0.01f;
  options.nesterov = nesterov;
  return options;
}

TEST(CudaOptimizer, AdamWMatchesCpuOnGptTiny) {
  FT_SKIP_WITHOUT_GPU();
  expect_training_matches_cpu(Layout::kGptTiny, adamw_options());
}

TEST(CudaOptimizer, AdamWMatchesCpuOnManyTensors) {
  FT_SKIP_WITHOUT_GPU();
  expect_training_matches_cpu(Layout::kManyTensors, adamw_options());
}

TEST(CudaOptimizer, SgdMomentumMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_training_matches_cpu(Layout::kGptTiny, sgd_options(false));
  expect_training_matches_cpu(Layout::kManyTensors, sgd_options(false));
}

TEST(CudaOptimizer, SgdNesterovMatchesCpu) {
  FT_SKIP_WITHOUT_GPU();
  expect_training_matches_cpu(Layout::kManyTensors, sgd_options(true));
}

TEST(CudaOptimizer, SquareSumMatchesCpuAndBothCudaSweepsAgreeBitwise) {
  FT_SKIP_WITHOUT_GPU();
  for (Layout layout : {Layout::kGptTiny, Layout::kManyTensors}) {
    auto cpu = make_store(layout, Device::kCpu);
    auto cuda = make_store(layout, test::kGpu);
    set_grads(*cpu, 7);
    set_grads(*cuda, 7);
    const double expected = make_per_tensor_sweep()->square_sum(*cpu);
    const double per_tensor = make_per_tensor_sweep()->square_sum(*cuda);
    const double multi_tensor = make_multi_tensor_sweep(*cuda)->square_sum(*cuda);
    EXPECT_GT(expected, 0.0);
    EXPECT_NEAR(per_tensor, expected, 1e-12 * expected);
    EXPECT_EQ(multi_tensor, per_tensor);
  }
}

TEST(CudaOptimizer, ScaleAndZeroAreExact) {
  FT_SKIP_WITHOUT_GPU();
  for (Layout layout : {Layout::kGptTiny, Layout::kManyTensors}) {
    auto cpu = make_store(layout, Device::kCpu);
    set_grads(*cpu, 9);
    make_per_tensor_sweep()->scale(*cpu, 0.37f);
    const std::vector<float> expected = cpu->flat_grads().to_host_vector();
    for (SweepKind kind : {SweepKind::kPerTensor, SweepKind::kMultiTensor}) {
      auto cuda = make_store(layout, test::kGpu);
      const std::shared_ptr<ParamSweep> sweep = make_sweep(kind, *cuda);
      set_grads(*cuda, 9);
      sweep->scale(*cuda, 0.37f);
      EXPECT_EQ(cuda->flat_grads().to_host_vector(), expected);
      sweep->zero(*cuda);
      const std::vector<float> zeroed = cuda->flat_grads().to_host_vector();
      int64_t nonzero = 0;
      for (float g : zeroed) nonzero += g != 0.0f;
      EXPECT_EQ(nonzero, 0);
      EXPECT_EQ(zeroed.size(), expected.size());
    }
  }
}

}  // namespace
}  // namespace ft
