#include "model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/check.h"
#include "kernels/step_control.h"
#if defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_context.h"
#endif

namespace ft {

namespace {

// Per-tensor sweeps split a large tensor into blocks over the threads, as the per-tensor loops
// of PyTorch's foreach-free optimizers do: one parallel region per tensor.
constexpr int64_t kTensorBlock = 16384;

template <typename Update>
void for_each_tensor(ParamStore& params, const Update& update) {
  for (ParamId id = 0; id < params.size(); ++id) {
    Param& param = params[id];
    if (!param.trainable) continue;
    const int64_t count = param.value.numel();
    const int64_t blocks = (count + kTensorBlock - 1) / kTensorBlock;
#pragma omp parallel for if (blocks > 2)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t begin = block * kTensorBlock;
      update(param, begin, std::min(count, begin + kTensorBlock) - begin);
    }
  }
}

AdamWStep adamw_step_constants(const OptimizerOptions& options, int64_t step, float lr) {
  AdamWStep constants;
  constants.beta1 = options.beta1;
  constants.beta2 = options.beta2;
  constants.eps = options.eps;
  const float bias1 = 1.0f - std::pow(options.beta1, static_cast<float>(step));
  const float bias2 = 1.0f - std::pow(options.beta2, static_cast<float>(step));
  constants.step_size = lr / bias1;
  constants.inv_sqrt_bias2 = 1.0f / std::sqrt(bias2);
  constants.decay = lr * options.weight_decay;
  return constants;
}

void check_state_device(const ParamStore& params, const Tensor& state, const char* what) {
  FT_CHECK(state.device() == params.device() && state.numel() == params.num_trainable_floats(),
           "optimizer sweep: ", what, " must hold ", params.num_trainable_floats(), " floats on ",
           device_name(params.device()), "; it holds ", state.numel(), " on ",
           device_name(state.device()));
}

#if defined(FT_HAVE_CUDA)
// The per-tensor sweep on cuda: the CPU sweep's loops, one kernel launch per tensor.
class PerTensorCudaSweep {
 public:
  static void adamw(ParamStore& params, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamWStep& step,
                    const DeviceStepControl* control) {
    const CudaStream stream = cuda_context().compute_stream();
    for (ParamId id = 0; id < params.size(); ++id) {
      Param& param = params[id];
      if (!param.trainable) continue;
      adamw_update_cuda(param.value.data(), exp_avg.data() + param.offset,
                        exp_avg_sq.data() + param.offset, param.grad.data(), param.value.numel(),
                        step, param.weight_decay, control, stream);
    }
  }

  static void sgd(ParamStore& params, Tensor& momentum_buffer, const SgdStep& step,
                  const DeviceStepControl* control) {
    const CudaStream stream = cuda_context().compute_stream();
    for (ParamId id = 0; id < params.size(); ++id) {
      Param& param = params[id];
      if (!param.trainable) continue;
      sgd_update_cuda(param.value.data(), momentum_buffer.data() + param.offset, param.grad.data(),
                      param.value.numel(), step, param.weight_decay, control, stream);
    }
  }

  // A partial per (tensor, chunk of the tensor) in offset order, then one reduction: the blocks
  // and their order are those of fusion/multi_tensor.cu, so the two cuda norms agree bitwise.
  // With device_total the total stays on the device (returns 0); else it is copied back.
  static double square_sum(ParamStore& params, double* device_total = nullptr) {
    const CudaStream stream = cuda_context().compute_stream();
    int64_t partial_count = 0;
    for (ParamId id = 0; id < params.size(); ++id)
      if (params[id].trainable)
        partial_count += (params[id].grad.numel() + kSweepChunk - 1) / kSweepChunk;
    // Doubles in a float tensor (the allocator aligns to 256 bytes): the partials, then the total.
    Tensor scratch = Tensor::empty({2 * (partial_count + 1)}, Device::kCuda);
    double* partials = reinterpret_cast<double*>(scratch.data());
    int64_t at = 0;
    for (ParamId id = 0; id < params.size(); ++id) {
      const Param& param = params[id];
      if (!param.trainable) continue;
      square_sum_partials_cuda(partials + at, param.grad.data(), param.grad.numel(), stream);
      at += (param.grad.numel() + kSweepChunk - 1) / kSweepChunk;
    }
    if (device_total != nullptr) {
      square_sum_total_on_device_cuda(device_total, partials, partial_count, stream);
      return 0.0;
    }
    if (partial_count == 0) return 0.0;
    return square_sum_total_cuda(partials + partial_count, partials, partial_count, stream);
  }

  static void scale(ParamStore& params, float scale) {
    const CudaStream stream = cuda_context().compute_stream();
    for (ParamId id = 0; id < params.size(); ++id) {
      Param& param = params[id];
      if (param.trainable) scale_cuda(param.grad.data(), param.grad.numel(), scale, stream);
    }
  }
};
#endif

// The twin of fusion/multi_tensor.h's chunked sweep. On cuda it runs PerTensorCudaSweep; zeroing
// is ParamStore::zero_grads on both devices (a fill per tensor).
class PerTensorSweep : public ParamSweep {
 public:
  void adamw(ParamStore& params, Tensor& exp_avg, Tensor& exp_avg_sq,
             const AdamWStep& step) override {
    check_state_device(params, exp_avg, "exp_avg");
    check_state_device(params, exp_avg_sq, "exp_avg_sq");
#if defined(FT_HAVE_CUDA)
    if (params.device() == Device::kCuda)
      return PerTensorCudaSweep::adamw(params, exp_avg, exp_avg_sq, step, device_control());
#endif
    for_each_tensor(params, [&](Param& param, int64_t begin, int64_t count) {
      const int64_t at = param.offset + begin;
      adamw_update(param.value.data() + begin, exp_avg.data() + at, exp_avg_sq.data() + at,
                   param.grad.data() + begin, count, step, param.weight_decay);
    });
  }

  void sgd(ParamStore& params, Tensor& momentum_buffer, const SgdStep& step) override {
    check_state_device(params, momentum_buffer, "momentum_buffer");
#if defined(FT_HAVE_CUDA)
    if (params.device() == Device::kCuda)
      return PerTensorCudaSweep::sgd(params, momentum_buffer, step, device_control());
#endif
    for_each_tensor(params, [&](Param& param, int64_t begin, int64_t count) {
      sgd_update(param.value.data() + begin, momentum_buffer.data() + param.offset + begin,
                 param.grad.data() + begin, count, step, param.weight_decay);
    });
  }

  // Tensors are visited in offset order, so each chunk's lanes see their floats in index order,
  // exactly as the chunked pass does (see kNormLanes in optimizer.h).
  double square_sum(ParamStore& params) override {
#if defined(FT_HAVE_CUDA)
    if (params.device() == Device::kCuda) return PerTensorCudaSweep::square_sum(params);
#endif
    const float* grads = params.flat_grads().data();
    const int64_t count = params.flat_grads().numel();
    std::vector<NormLanes> chunk_lanes((count + kSweepChunk - 1) / kSweepChunk, NormLanes{});
    for (ParamId id = 0; id < params.size(); ++id) {
      const Param& param = params[id];
      if (!param.trainable) continue;
      const int64_t end = param.offset + param.grad.numel();
      for (int64_t at = param.offset; at < end;) {
        const int64_t chunk = at / kSweepChunk;
        const int64_t stop = std::min(end, (chunk + 1) * kSweepChunk);
        accumulate_squares(chunk_lanes[chunk], grads + at, at, stop - at);
        at = stop;
      }
    }
    return sum_chunk_lanes(chunk_lanes);
  }

  void scale(ParamStore& params, float scale) override {
#if defined(FT_HAVE_CUDA)
    if (params.device() == Device::kCuda) return PerTensorCudaSweep::scale(params, scale);
#endif
    for_each_tensor(params, [&](Param& param, int64_t begin, int64_t count) {
      float* grad = param.grad.data() + begin;
      for (int64_t i = 0; i < count; ++i) grad[i] *= scale;
    });
  }

  void square_sum_on_device(ParamStore& params, double* device_total) override {
    FT_CHECK(params.device() == Device::kCuda, "square_sum_on_device on cpu parameters");
#if defined(FT_HAVE_CUDA)
    PerTensorCudaSweep::square_sum(params, device_total);
#else
    static_cast<void>(device_total);
#endif
  }

  void zero(ParamStore& params) override {
    params.zero_grads();
  }
};

class AdamW : public Optimizer {
 public:
  AdamW(const OptimizerOptions& options, ParamStore& params, std::shared_ptr<ParamSweep> sweep)
      : options_(options),
        sweep_(std::move(sweep)),
        exp_avg_(Tensor::zeros({params.num_trainable_floats()}, params.device())),
        exp_avg_sq_(Tensor::zeros({params.num_trainable_floats()}, params.device())) {}

  void step(ParamStore& params, float lr) override {
    ++steps_taken_;
    sweep_->adamw(params, exp_avg_, exp_avg_sq_, adamw_step_constants(options_, steps_taken_, lr));
    params.mark_changed();
    if (sweep_->writes_bf16_copies()) params.mark_bf16_copies_fresh();
  }

  void next_step_constants(float lr, DeviceStepControl* control) const override {
    control->adamw = adamw_step_constants(options_, steps_taken_ + 1, lr);
  }

  std::vector<std::pair<std::string, Tensor*>> state_slots() override {
    return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
  }

 private:
  OptimizerOptions options_;
  std::shared_ptr<ParamSweep> sweep_;
  Tensor exp_avg_, exp_avg_sq_;
};

class Sgd : public Optimizer {
 public:
  Sgd(const OptimizerOptions& options, ParamStore& params, std::shared_ptr<ParamSweep> sweep)
      : options_(options),
        sweep_(std::move(sweep)),
        momentum_buffer_(Tensor::zeros({params.num_trainable_floats()}, params.device())) {}

  void step(ParamStore& params, float lr) override {
    const SgdStep constants = constants_at(lr);
    ++steps_taken_;
    sweep_->sgd(params, momentum_buffer_, constants);
    params.mark_changed();
    if (sweep_->writes_bf16_copies()) params.mark_bf16_copies_fresh();
  }

  void next_step_constants(float lr, DeviceStepControl* control) const override {
    control->sgd = constants_at(lr);
  }

  std::vector<std::pair<std::string, Tensor*>> state_slots() override {
    return {{"momentum_buffer", &momentum_buffer_}};
  }

 private:
  SgdStep constants_at(float lr) const {
    SgdStep constants;
    constants.lr = lr;
    constants.momentum = options_.momentum;
    constants.weight_decay = options_.weight_decay;
    constants.nesterov = options_.nesterov;
    constants.first_step = steps_taken_ == 0;
    return constants;
  }

  OptimizerOptions options_;
  std::shared_ptr<ParamSweep> sweep_;
  Tensor momentum_buffer_;
};

}  // namespace

std::unique_ptr<ParamSweep> make_per_tensor_sweep() {
  return std::make_unique<PerTensorSweep>();
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, ParamStore& params,
                                          std::shared_ptr<ParamSweep> sweep) {
  FT_CHECK(sweep != nullptr, "make_optimizer: no parameter sweep given");
  if (options.name == "adamw") return std::make_unique<AdamW>(options, params, std::move(sweep));
  if (options.name == "sgd") return std::make_unique<Sgd>(options, params, std::move(sweep));
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

float grad_norm(ParamStore& params, ParamSweep& sweep) {
  return static_cast<float>(std::sqrt(sweep.square_sum(params)));
}

float clip_grad_norm(ParamStore& params, float max_norm, ParamSweep& sweep) {
  const float norm = grad_norm(params, sweep);
  const float scale = clip_grad_scale(norm, max_norm);  // the CUDA-graph step's formula too
  if (scale != 1.0f) sweep.scale(params, scale);
  return norm;
}

float clip_grad_norm(ParamStore& params, float max_norm) {
  PerTensorSweep sweep;
  return clip_grad_norm(params, max_norm, sweep);
}

}  // namespace ft
