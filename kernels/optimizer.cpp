// The optimizers' range kernels on the CPU (optimizer.h).
#include "kernels/optimizer.h"

namespace ft {

// The math of both updates is in optimizer_math.h (shared with the CUDA kernels). The
// loops hoist the decay choice, so each stays a branch-free vectorisable loop.
void adamw_update(float* value, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t count,
                  const AdamWStep& step, bool weight_decay) {
  const AdamWStep constants = step;
  const float decay = weight_decay ? step.decay : 0.0f;
#pragma omp simd
  for (int64_t i = 0; i < count; ++i)
    adamw_element(value[i], exp_avg[i], exp_avg_sq[i], grad[i], constants, decay);
}

void sgd_update(float* value, float* momentum_buffer, const float* grad, int64_t count,
                const SgdStep& step, bool weight_decay) {
  const SgdStep constants = step;
  const float decay = weight_decay ? step.weight_decay : 0.0f;
#pragma omp simd
  for (int64_t i = 0; i < count; ++i)
    sgd_element(value[i], momentum_buffer[i], grad[i], constants, decay);
}

void adamw_update(float* value, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t count,
                  const AdamWStep& step, bool weight_decay, bf16_bits* bf16_value) {
  const AdamWStep constants = step;
  const float decay = weight_decay ? step.decay : 0.0f;
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) {
    adamw_element(value[i], exp_avg[i], exp_avg_sq[i], grad[i], constants, decay);
    bf16_value[i] = float_to_bf16(value[i]);
  }
}

void sgd_update(float* value, float* momentum_buffer, const float* grad, int64_t count,
                const SgdStep& step, bool weight_decay, bf16_bits* bf16_value) {
  const SgdStep constants = step;
  const float decay = weight_decay ? step.weight_decay : 0.0f;
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) {
    sgd_element(value[i], momentum_buffer[i], grad[i], constants, decay);
    bf16_value[i] = float_to_bf16(value[i]);
  }
}

void adamw_update_consuming(float* value, float* exp_avg, float* exp_avg_sq, float* grad,
                            int64_t count, const AdamWStep& step, bool weight_decay,
                            bf16_bits* bf16_value, float grad_scale) {
  const AdamWStep constants = step;
  const float decay = weight_decay ? step.decay : 0.0f;
  if (bf16_value == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) {
      adamw_element(value[i], exp_avg[i], exp_avg_sq[i], grad[i] * grad_scale, constants, decay);
      grad[i] = 0.0f;
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) {
    adamw_element(value[i], exp_avg[i], exp_avg_sq[i], grad[i] * grad_scale, constants, decay);
    grad[i] = 0.0f;
    bf16_value[i] = float_to_bf16(value[i]);
  }
}

void sgd_update_consuming(float* value, float* momentum_buffer, float* grad, int64_t count,
                          const SgdStep& step, bool weight_decay, bf16_bits* bf16_value) {
  const SgdStep constants = step;
  const float decay = weight_decay ? step.weight_decay : 0.0f;
  if (bf16_value == nullptr) {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) {
      sgd_element(value[i], momentum_buffer[i], grad[i], constants, decay);
      grad[i] = 0.0f;
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < count; ++i) {
    sgd_element(value[i], momentum_buffer[i], grad[i], constants, decay);
    grad[i] = 0.0f;
    bf16_value[i] = float_to_bf16(value[i]);
  }
}

void accumulate_squares(NormLanes& lanes, const float* grad, int64_t flat_index, int64_t count) {
  int64_t i = 0;
  for (; i < count && (flat_index + i) % kNormLanes != 0; ++i)
    lanes[(flat_index + i) % kNormLanes] += static_cast<double>(grad[i]) * grad[i];
  // From here flat_index + i is a multiple of kNormLanes, so element i + lane is in `lane`.
  double acc[kNormLanes];
  for (int lane = 0; lane < kNormLanes; ++lane) acc[lane] = lanes[lane];
  for (; i + kNormLanes <= count; i += kNormLanes) {
#pragma omp simd
    for (int lane = 0; lane < kNormLanes; ++lane)
      acc[lane] += static_cast<double>(grad[i + lane]) * grad[i + lane];
  }
  for (int lane = 0; lane < kNormLanes; ++lane) lanes[lane] = acc[lane];
  for (; i < count; ++i)
    lanes[(flat_index + i) % kNormLanes] += static_cast<double>(grad[i]) * grad[i];
}

double sum_chunk_lanes(const std::vector<NormLanes>& chunk_lanes) {
  double total = 0.0;
  for (const NormLanes& lanes : chunk_lanes) {
    double chunk = 0.0;
    for (double lane : lanes) chunk += lane;
    total += chunk;
  }
  return total;
}

}  // namespace ft
