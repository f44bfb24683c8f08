// Tests for fusion.horizontal.multi_tensor: MultiTensorSweep's chunked passes over the flat
// buffers against the per-tensor sweep of model/optimizer.cpp (the twin), which must agree bit
// for bit. Two stores
// with gpt_tiny's parameters (13 chunks of 65,536 floats, weight decay on matrices only) take
// the same gradients; AdamW and SGD (plain and Nesterov) run several steps with weight decay and
// clipping; values, optimizer state and the gradient norm are compared with memcmp.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "fusion/multi_tensor.h"
#include "kernels/step_control.h"
#include "model/gpt.h"
#include "model/optimizer.h"

namespace ft {
namespace {

const GptShape kGptTiny{4, 4, 128, 64, 256, 0.0f, false};

std::unique_ptr<ParamStore> make_store(bool bf16_copies = false) {
  auto params = std::make_unique<ParamStore>();
  register_gpt_params(kGptTiny, *params);
  if (bf16_copies) params->enable_bf16_copies();
  params->allocate();
  params->initialize(11);
  return params;
}

void fill_grads(ParamStore& params, uint64_t seed) {
  Rng rng(seed);
  Tensor& grads = params.flat_grads();
  for (int64_t i = 0; i < grads.numel(); ++i) grads.data()[i] = 0.05f * rng.normal();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<size_t>(a.numel())) == 0;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

TEST(MultiTensorPlanTest, SegmentsCoverTheBufferOnceWithEachParamsDecayFlag) {
  const auto params = make_store();
  const MultiTensorPlan plan = make_multi_tensor_plan(*params);
  const int64_t numel = params->num_trainable_floats();
  ASSERT_EQ(plan.numel, numel);
  ASSERT_EQ(plan.num_chunks(), (numel + kSweepChunk - 1) / kSweepChunk);
  EXPECT_GE(plan.num_chunks(), 10);
  std::vector<int8_t> flag(numel, -1);
  for (ParamId id = 0; id < params->size(); ++id) {
    const Param& param = (*params)[id];
    for (int64_t i = 0; i < param.value.numel(); ++i) flag[param.offset + i] = param.weight_decay;
  }
  std::vector<int> covered(numel, 0);
  for (int64_t chunk = 0; chunk < plan.num_chunks(); ++chunk)
    for (int s = plan.chunk_segments[chunk]; s < plan.chunk_segments[chunk + 1]; ++s) {
      const MultiTensorSegment& segment = plan.segments[s];
      EXPECT_GE(segment.begin, chunk * kSweepChunk);
      EXPECT_LE(segment.end, std::min(numel, (chunk + 1) * kSweepChunk));
      for (int64_t i = segment.begin; i < segment.end; ++i) {
        ++covered[i];
        ASSERT_EQ(flag[i], segment.weight_decay ? 1 : 0) << "flat index " << i;
      }
    }
  for (int64_t i = 0; i < numel; ++i) ASSERT_EQ(covered[i], 1) << "flat index " << i;
  // Matrices decay, biases and norms do not: both flags appear.
  int decayed = 0;
  for (const MultiTensorSegment& segment : plan.segments) decayed += segment.weight_decay;
  EXPECT_GT(decayed, 0);
  EXPECT_LT(decayed, static_cast<int>(plan.segments.size()));
}

// `steps` steps of clip + optimizer on two stores, per-tensor on one thread and multi-tensor on
// two; every step's norm, and at the end the values and every state slot, are bit-equal.
void expect_sweeps_bit_equal(OptimizerOptions options, int steps) {
  const auto per_tensor = make_store();
  const auto chunked = make_store();
  std::shared_ptr<ParamSweep> per_tensor_sweep = make_per_tensor_sweep();
  std::shared_ptr<ParamSweep> chunked_sweep = make_multi_tensor_sweep(*chunked);
  auto per_tensor_optimizer = make_optimizer(options, *per_tensor, per_tensor_sweep);
  auto chunked_optimizer = make_optimizer(options, *chunked, chunked_sweep);
  const int threads = omp_get_max_threads();
  for (int step = 0; step < steps; ++step) {
    fill_grads(*per_tensor, 100 + step);
    fill_grads(*chunked, 100 + step);
    omp_set_num_threads(1);
    const float norm = clip_grad_norm(*per_tensor, 1.0f, *per_tensor_sweep);
    per_tensor_optimizer->step(*per_tensor, 1e-2f);
    omp_set_num_threads(2);
    const float chunked_norm = clip_grad_norm(*chunked, 1.0f, *chunked_sweep);
    chunked_optimizer->step(*chunked, 1e-2f);
    EXPECT_GT(norm, 1.0f) << "clipping must be exercised";
    EXPECT_TRUE(same_bits(norm, chunked_norm))
        << "step " << step << ": " << norm << " vs " << chunked_norm;
    EXPECT_TRUE(same_bits(per_tensor->flat_grads(), chunked->flat_grads())) << "clipped grads";
  }
  omp_set_num_threads(threads);
  EXPECT_TRUE(same_bits(per_tensor->flat_values(), chunked->flat_values()));
  const auto slots = per_tensor_optimizer->state_slots();
  const auto chunked_slots = chunked_optimizer->state_slots();
  ASSERT_EQ(slots.size(), chunked_slots.size());
  for (size_t s = 0; s < slots.size(); ++s) {
    EXPECT_EQ(slots[s].first, chunked_slots[s].first);
    EXPECT_TRUE(same_bits(*slots[s].second, *chunked_slots[s].second)) << slots[s].first;
  }
  // The parameters moved: the comparison above is not between two untouched stores.
  const auto initial = make_store();
  EXPECT_FALSE(same_bits(initial->flat_values(), chunked->flat_values()));
}

TEST(MultiTensorTest, AdamWMatchesPerTensorBitwise) {
  OptimizerOptions options;
  options.name = "adamw";
  options.weight_decay = 0.1f;
  expect_sweeps_bit_equal(options, 5);
}

TEST(MultiTensorTest, SgdMomentumMatchesPerTensorBitwise) {
  OptimizerOptions options;
  options.name = "sgd";
  options.weight_decay = 5e-4f;
  options.momentum = 0.9f;
  expect_sweeps_bit_equal(options, 4);
  options.nesterov = true;
  expect_sweeps_bit_equal(options, 4);
}

// Weight decay is honoured per parameter: with zero gradients and zero state, SGD moves only
// the decayed parameters, by exactly lr * wd * p.
TEST(MultiTensorTest, WeightDecayFollowsEachParametersFlag) {
  const auto params = make_store();
  OptimizerOptions options;
  options.name = "sgd";
  options.weight_decay = 0.5f;
  auto optimizer = make_optimizer(options, *params, make_multi_tensor_sweep(*params));
  const auto before = make_store();
  params->flat_grads().fill(0.0f);
  optimizer->step(*params, 0.1f);
  for (ParamId id = 0; id < params->size(); ++id) {
    const Param& param = (*params)[id];
    const float* was = (*before)[id].value.data();
    for (int64_t i = 0; i < param.value.numel(); ++i) {
      const float expected = param.weight_decay ? was[i] - 0.1f * (0.5f * was[i]) : was[i];
      ASSERT_EQ(param.value.data()[i], expected) << param.name << "[" << i << "]";
    }
  }
}

TEST(MultiTensorTest, GradNormMatchesPerTensorBitwiseAndADoubleReference) {
  const auto params = make_store();
  fill_grads(*params, 7);
  const Tensor& grads = params->flat_grads();
  long double reference = 0;
  for (int64_t i = 0; i < grads.numel(); ++i)
    reference += static_cast<long double>(grads.data()[i]) * grads.data()[i];
  const float per_tensor = clip_grad_norm(*params, 0.0f, *make_per_tensor_sweep());  // no clip
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  const float chunked = clip_grad_norm(*params, 0.0f, *make_multi_tensor_sweep(*params));
  omp_set_num_threads(threads);
  EXPECT_TRUE(same_bits(per_tensor, chunked)) << per_tensor << " vs " << chunked;
  EXPECT_NEAR(chunked, static_cast<float>(std::sqrt(reference)), 1e-6f * chunked);
}

// The lane order makes the sum independent of where a range is cut: any split of the buffer
// into consecutive pieces gives the chunked pass's bits.
TEST(MultiTensorTest, SquareSumDoesNotDependOnWhereTensorsAreCut) {
  const int64_t numel = 3 * kSweepChunk + 1234;
  std::vector<float> data(numel);
  Rng rng(3);
  for (float& value : data) value = rng.normal();
  const double chunked = multi_tensor_square_sum(data.data(), numel);
  std::vector<NormLanes> lanes((numel + kSweepChunk - 1) / kSweepChunk, NormLanes{});
  for (int64_t at = 0; at < numel;) {
    const int64_t chunk = at / kSweepChunk;
    const int64_t piece = 1 + static_cast<int64_t>(rng.below(997));  // odd, misaligned cuts
    const int64_t stop = std::min({numel, (chunk + 1) * kSweepChunk, at + piece});
    accumulate_squares(lanes[chunk], data.data() + at, at, stop - at);
    at = stop;
  }
  const double pieces = sum_chunk_lanes(lanes);
  EXPECT_EQ(std::memcmp(&chunked, &pieces, sizeof(double)), 0) << chunked << " vs " << pieces;
}

// The clip and the next step's zeroing folded into the multi-tensor update
// (fold_into_next_update) against the twin's separate passes: the per-tensor sweep's scale (when
// the clip scales), update and zero. Values, state and the bf16 weight copies are bit-equal, the
// folded store's gradients are zero after each update, and a step without a fold request leaves
// them as they were. Steps alternate between clipping and not (scale 1).
void expect_folded_passes_bit_equal(OptimizerOptions options) {
  const auto twin = make_store(true);
  const auto folded = make_store(true);
  std::shared_ptr<ParamSweep> twin_sweep = make_per_tensor_sweep();
  std::shared_ptr<ParamSweep> folded_sweep = make_multi_tensor_sweep(*folded);
  auto twin_optimizer = make_optimizer(options, *twin, twin_sweep);
  auto folded_optimizer = make_optimizer(options, *folded, folded_sweep);
  int clipped = 0;
  for (int step = 0; step < 4; ++step) {
    fill_grads(*twin, 200 + step);
    fill_grads(*folded, 200 + step);
    const float max_norm = step % 2 == 0 ? 1.0f : 1e6f;
    const float norm = grad_norm(*twin, *twin_sweep);
    const float scale = clip_grad_scale(norm, max_norm);
    clipped += scale != 1.0f;
    if (scale != 1.0f) twin_sweep->scale(*twin, scale);
    twin_optimizer->step(*twin, 1e-2f);
    twin_sweep->zero(*twin);
    ASSERT_TRUE(folded_sweep->fold_into_next_update(*folded, scale));
    folded_optimizer->step(*folded, 1e-2f);
    EXPECT_TRUE(same_bits(twin->flat_grads(), folded->flat_grads())) << "step " << step;
    EXPECT_TRUE(same_bits(twin->flat_values(), folded->flat_values())) << "step " << step;
  }
  EXPECT_EQ(clipped, 2);
  const auto slots = twin_optimizer->state_slots();
  const auto folded_slots = folded_optimizer->state_slots();
  for (size_t s = 0; s < slots.size(); ++s)
    EXPECT_TRUE(same_bits(*slots[s].second, *folded_slots[s].second)) << slots[s].first;
  twin->refresh_bf16_copies();
  const Tensor& twin_copies = twin->flat_bf16_values();
  const Tensor& folded_copies = folded->flat_bf16_values();
  ASSERT_EQ(twin_copies.numel(), folded_copies.numel());
  EXPECT_EQ(std::memcmp(twin_copies.bf16_data(), folded_copies.bf16_data(),
                        sizeof(bf16_bits) * static_cast<size_t>(twin_copies.numel())),
            0);
  // No request: the update reads the gradients and leaves them.
  fill_grads(*folded, 300);
  const std::vector<float> before = folded->flat_grads().to_host_vector();
  folded_optimizer->step(*folded, 1e-2f);
  EXPECT_EQ(folded->flat_grads().to_host_vector(), before);
}

TEST(MultiTensorTest, FoldedClipAndZeroingMatchTheSeparatePassesBitwise) {
  OptimizerOptions options;
  options.name = "adamw";
  options.weight_decay = 0.1f;
  expect_folded_passes_bit_equal(options);
  options.name = "sgd";
  options.weight_decay = 5e-4f;
  options.momentum = 0.9f;
  expect_folded_passes_bit_equal(options);
}

TEST(MultiTensorTest, OnlyTheMultiTensorSweepFolds) {
  const auto params = make_store();
  EXPECT_FALSE(make_per_tensor_sweep()->fold_into_next_update(*params, 0.5f));
  EXPECT_TRUE(make_multi_tensor_sweep(*params)->fold_into_next_update(*params, 0.5f));
}

TEST(MultiTensorTest, ZeroingClearsEveryGradient) {
  for (bool multi_tensor : {false, true}) {
    const auto params = make_store();
    params->flat_grads().fill(std::numeric_limits<float>::quiet_NaN());
    const std::unique_ptr<ParamSweep> sweep =
        multi_tensor ? make_multi_tensor_sweep(*params) : make_per_tensor_sweep();
    sweep->zero(*params);
    const Tensor& grads = params->flat_grads();
    int64_t nonzero = 0;
    for (int64_t i = 0; i < grads.numel(); ++i) nonzero += !(grads.data()[i] == 0.0f);
    EXPECT_EQ(nonzero, 0) << (multi_tensor ? "multi-tensor" : "per-tensor");
  }
}

}  // namespace
}  // namespace ft
