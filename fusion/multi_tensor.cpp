// Chunked passes over the flat parameter buffers (see multi_tensor.h). Chunks are independent,
// so a static schedule splits them over the threads; the elementwise kernels make the result
// independent of that split, and the norm's partials are combined in chunk order afterwards.
#include "fusion/multi_tensor.h"

#include <algorithm>

#include "core/check.h"

namespace ft {
namespace {

int64_t chunk_count(int64_t numel) {
  return (numel + kSweepChunk - 1) / kSweepChunk;
}

}  // namespace

MultiTensorPlan make_multi_tensor_plan(const ParamStore& params) {
  FT_CHECK(params.allocated(), "make_multi_tensor_plan: parameters are not allocated");
  // Flat ranges by flag, in offset order (registration order), adjacent equal flags merged.
  std::vector<MultiTensorSegment> ranges;
  for (ParamId id = 0; id < params.size(); ++id) {
    const Param& param = params[id];
    if (!param.trainable) continue;
    const int64_t begin = param.offset, end = param.offset + param.value.numel();
    if (!ranges.empty() && ranges.back().end == begin &&
        ranges.back().weight_decay == param.weight_decay)
      ranges.back().end = end;
    else
      ranges.push_back({begin, end, param.weight_decay});
  }
  std::sort(
      ranges.begin(), ranges.end(),
      [](const MultiTensorSegment& a, const MultiTensorSegment& b) { return a.begin < b.begin; });
  MultiTensorPlan plan;
  plan.numel = params.num_trainable_floats();
  const int64_t chunks = chunk_count(plan.numel);
  plan.chunk_segments.push_back(0);
  size_t range = 0;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t chunk_begin = chunk * kSweepChunk;
    const int64_t chunk_end = std::min(plan.numel, chunk_begin + kSweepChunk);
    while (range < ranges.size() && ranges[range].end <= chunk_begin) ++range;
    for (size_t r = range; r < ranges.size() && ranges[r].begin < chunk_end; ++r)
      plan.segments.push_back({std::max(ranges[r].begin, chunk_begin),
                               std::min(ranges[r].end, chunk_end), ranges[r].weight_decay});
    plan.chunk_segments.push_back(static_cast<int>(plan.segments.size()));
  }
  return plan;
}

void multi_tensor_adamw(const MultiTensorPlan& plan, float* values, float* exp_avg,
                        float* exp_avg_sq, const float* grads, const AdamWStep& step) {
  const int64_t chunks = plan.num_chunks();
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int s = plan.chunk_segments[chunk]; s < plan.chunk_segments[chunk + 1]; ++s) {
      const MultiTensorSegment& segment = plan.segments[s];
      const int64_t begin = segment.begin;
      adamw_update(values + begin, exp_avg + begin, exp_avg_sq + begin, grads + begin,
                   segment.end - begin, step, segment.weight_decay);
    }
}

void multi_tensor_sgd(const MultiTensorPlan& plan, float* values, float* momentum_buffer,
                      const float* grads, const SgdStep& step) {
  const int64_t chunks = plan.num_chunks();
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    for (int s = plan.chunk_segments[chunk]; s < plan.chunk_segments[chunk + 1]; ++s) {
      const MultiTensorSegment& segment = plan.segments[s];
      const int64_t begin = segment.begin;
      sgd_update(values + begin, momentum_buffer + begin, grads + begin, segment.end - begin, step,
                 segment.weight_decay);
    }
}

void multi_tensor_zero(float* data, int64_t numel) {
  const int64_t chunks = chunk_count(numel);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kSweepChunk;
    std::fill(data + begin, data + std::min(numel, begin + kSweepChunk), 0.0f);
  }
}

void multi_tensor_scale(float* data, int64_t numel, float scale) {
  const int64_t chunks = chunk_count(numel);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kSweepChunk, end = std::min(numel, begin + kSweepChunk);
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) data[i] *= scale;
  }
}

double multi_tensor_square_sum(const float* data, int64_t numel) {
  const int64_t chunks = chunk_count(numel);
  std::vector<NormLanes> chunk_lanes(chunks, NormLanes{});
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t begin = chunk * kSweepChunk;
    accumulate_squares(chunk_lanes[chunk], data + begin, begin,
                       std::min(numel, begin + kSweepChunk) - begin);
  }
  return sum_chunk_lanes(chunk_lanes);
}

MultiTensorSweep::MultiTensorSweep(const ParamStore& params)
    : plan_(make_multi_tensor_plan(params)) {}

void MultiTensorSweep::check_store(const ParamStore& params) const {
  FT_CHECK(params.num_trainable_floats() == plan_.numel, "MultiTensorSweep: planned for ",
           plan_.numel, " trainable floats, given a store with ", params.num_trainable_floats());
}

void MultiTensorSweep::adamw(ParamStore& params, Tensor& exp_avg, Tensor& exp_avg_sq,
                             const AdamWStep& step) {
  check_store(params);
  multi_tensor_adamw(plan_, params.flat_values().data(), exp_avg.data(), exp_avg_sq.data(),
                     params.flat_grads().data(), step);
}

void MultiTensorSweep::sgd(ParamStore& params, Tensor& momentum_buffer, const SgdStep& step) {
  check_store(params);
  multi_tensor_sgd(plan_, params.flat_values().data(), momentum_buffer.data(),
                   params.flat_grads().data(), step);
}

double MultiTensorSweep::square_sum(ParamStore& params) {
  check_store(params);
  return multi_tensor_square_sum(params.flat_grads().data(), plan_.numel);
}

void MultiTensorSweep::scale(ParamStore& params, float scale) {
  check_store(params);
  multi_tensor_scale(params.flat_grads().data(), plan_.numel, scale);
}

void MultiTensorSweep::zero(ParamStore& params) {
  check_store(params);
  multi_tensor_zero(params.flat_grads().data(), plan_.numel);
}

std::unique_ptr<ParamSweep> make_multi_tensor_sweep(const ParamStore& params) {
  return std::make_unique<MultiTensorSweep>(params);
}

}  // namespace ft
