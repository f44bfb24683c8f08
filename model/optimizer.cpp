#include "model/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace ft {
namespace {

// AdamW (Loshchilov & Hutter): m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
// p -= lr (m_hat / (sqrt(v_hat) + eps) + wd p), with m_hat = m / (1-b1^t), v_hat = v / (1-b2^t).
// The decay is decoupled: it is not folded into g, so it does not pass through the moments.
class AdamW : public Optimizer {
 public:
  AdamW(const OptimizerOptions& options, ParamStore& params)
      : options_(options),
        exp_avg_(Tensor::zeros({params.num_trainable_floats()})),
        exp_avg_sq_(Tensor::zeros({params.num_trainable_floats()})) {}

  void step(ParamStore& params, float lr) override {
    ++steps_taken_;
    const float b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
    const float bias1 = 1.0f - std::pow(b1, static_cast<float>(steps_taken_));
    const float bias2 = 1.0f - std::pow(b2, static_cast<float>(steps_taken_));
    const float step_size = lr / bias1;
    const float inv_sqrt_bias2 = 1.0f / std::sqrt(bias2);
    for (ParamId id = 0; id < params.size(); ++id) {
      Param& param = params[id];
      if (!param.trainable) continue;
      const float decay = param.weight_decay ? lr * options_.weight_decay : 0.0f;
      float* value = param.value.data();
      const float* grad = param.grad.data();
      float* m = exp_avg_.data() + param.offset;
      float* v = exp_avg_sq_.data() + param.offset;
      const int64_t count = param.value.numel();
#pragma omp parallel for simd if (count > 32768)
      for (int64_t i = 0; i < count; ++i) {
        m[i] = b1 * m[i] + (1.0f - b1) * grad[i];
        v[i] = b2 * v[i] + (1.0f - b2) * grad[i] * grad[i];
        const float denom = std::sqrt(v[i]) * inv_sqrt_bias2 + eps;
        value[i] -= step_size * m[i] / denom + decay * value[i];
      }
    }
  }

  std::vector<std::pair<std::string, Tensor*>> state_slots() override {
    return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
  }

 private:
  OptimizerOptions options_;
  Tensor exp_avg_, exp_avg_sq_;
};

// SGD with momentum, PyTorch semantics: g' = g + wd p; buf = mu buf + g' (buf = g' on the first
// step); p -= lr (nesterov ? g' + mu buf : buf).
class Sgd : public Optimizer {
 public:
  Sgd(const OptimizerOptions& options, ParamStore& params)
      : options_(options), momentum_buffer_(Tensor::zeros({params.num_trainable_floats()})) {}

  void step(ParamStore& params, float lr) override {
    const bool first_step = steps_taken_ == 0;
    ++steps_taken_;
    const float mu = options_.momentum;
    for (ParamId id = 0; id < params.size(); ++id) {
      Param& param = params[id];
      if (!param.trainable) continue;
      const float decay = param.weight_decay ? options_.weight_decay : 0.0f;
      float* value = param.value.data();
      const float* grad = param.grad.data();
      float* buf = momentum_buffer_.data() + param.offset;
      const int64_t count = param.value.numel();
      for (int64_t i = 0; i < count; ++i) {
        const float g = grad[i] + decay * value[i];
        buf[i] = first_step ? g : mu * buf[i] + g;
        value[i] -= lr * (options_.nesterov ? g + mu * buf[i] : buf[i]);
      }
    }
  }

  std::vector<std::pair<std::string, Tensor*>> state_slots() override {
    return {{"momentum_buffer", &momentum_buffer_}};
  }

 private:
  OptimizerOptions options_;
  Tensor momentum_buffer_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, ParamStore& params) {
  if (options.name == "adamw") return std::make_unique<AdamW>(options, params);
  if (options.name == "sgd") return std::make_unique<Sgd>(options, params);
  FT_FAIL("unknown optimizer '", options.name, "' (allowed: adamw, sgd)");
}

float LrSchedule::at(int step) const {
  if (step < warmup_steps) return peak_lr * static_cast<float>(step + 1) / warmup_steps;
  const int decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0) return peak_lr;
  const float progress = std::min(1.0f, static_cast<float>(step - warmup_steps) / decay_steps);
  const float cosine = 0.5f * (1.0f + std::cos(3.14159265358979f * progress));
  return min_lr + (peak_lr - min_lr) * cosine;
}

float clip_grad_norm(ParamStore& params, float max_norm) {
  Tensor& grads = params.flat_grads();
  float* grad = grads.data();
  const int64_t count = grads.numel();
  // Fixed-size chunks summed in a fixed order keep the norm bitwise reproducible for any thread
  // count, which resume exactness relies on.
  constexpr int64_t kChunk = 16384;
  const int64_t num_chunks = (count + kChunk - 1) / kChunk;
  std::vector<double> partial(num_chunks, 0.0);
#pragma omp parallel for if (num_chunks > 4)
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    double sum_sq = 0.0;
    const int64_t end = std::min(count, (chunk + 1) * kChunk);
    for (int64_t i = chunk * kChunk; i < end; ++i) sum_sq += static_cast<double>(grad[i]) * grad[i];
    partial[chunk] = sum_sq;
  }
  double total = 0.0;
  for (double sum_sq : partial) total += sum_sq;
  const float norm = static_cast<float>(std::sqrt(total));
  if (max_norm > 0.0f && norm > max_norm) {
    const float scale = max_norm / (norm + 1e-6f);
#pragma omp parallel for simd if (count > 65536)
    for (int64_t i = 0; i < count; ++i) grad[i] *= scale;
  }
  return norm;
}

}  // namespace ft
