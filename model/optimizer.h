// Optimizers (AdamW, SGD with momentum), the learning-rate schedule, global-norm gradient
// clipping and gradient zeroing. Every pass over the parameters goes through a ParamSweep, a
// narrow interface saying how a sweep over the flat buffers is carried out: this file implements
// the per-tensor one (the twin); fusion/multi_tensor.h implements the chunked one, and app/
// chooses between them. Both call the range kernels of kernels/optimizer.h, so they agree
// bitwise. On cuda (params.device()) both run kernels over the same per-element helpers
// (kernels/optimizer_math.h), the per-tensor one launch per tensor, the multi-tensor one a few
// launches per pass.
// State tensors mirror the flat parameter buffer, so a parameter's state is a view at the same
// offset, and checkpoints store it per parameter under "optim.<slot>.<name>" either way.
// Thread safety: not synchronised; the training thread owns it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/optimizer.h"
#include "model/params.h"

namespace ft {

struct OptimizerOptions {
  std::string name = "adamw";  // adamw | sgd
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.0f;  // applied only to params with Param::weight_decay
  float momentum = 0.9f;
  bool nesterov = false;
};

// How a sweep over the flat parameter buffers is carried out: what the optimizers, clipping and
// zeroing need. State tensors are laid out like ParamStore::flat_values(), on params.device().
// On cpu, implementations must give the same bits as the per-tensor sweep (make_per_tensor_sweep).
// They dispatch on params.device(): on cuda every pass is kernels on the compute stream, and only
// square_sum waits for them (it returns its double to the host). On cuda the two sweeps' norms
// agree bitwise and their updates run the same helpers (nvcc's FMA contraction makes them agree
// with the cpu to a few ulp, not bitwise).
// REQUIRES: params allocated, and the store the sweep was made for where an implementation
// precomputes a layout.
class ParamSweep {
 public:
  virtual ~ParamSweep() = default;
  // adamw_update / sgd_update over every trainable float, with each parameter's decay flag.
  virtual void adamw(ParamStore& params, Tensor& exp_avg, Tensor& exp_avg_sq,
                     const AdamWStep& step) = 0;
  virtual void sgd(ParamStore& params, Tensor& momentum_buffer, const SgdStep& step) = 0;
  // Sum of the squares of every trainable gradient, in the order documented at kNormLanes.
  virtual double square_sum(ParamStore& params) = 0;
  // Multiplies every trainable gradient by `scale`.
  virtual void scale(ParamStore& params, float scale) = 0;
  // Sets every trainable gradient to zero.
  virtual void zero(ParamStore& params) = 0;
  // cuda only: square_sum written to *device_total (one device double), with no host
  // synchronisation, so a CUDA graph can capture it.
  virtual void square_sum_on_device(ParamStore& params, double* device_total) = 0;
  // True if adamw and sgd also write the store's bf16 weight copies (train.precision: bf16), so
  // the optimizer marks them fresh; otherwise the next forward casts them again.
  virtual bool writes_bf16_copies() const { return false; }
  // Asks the next adamw or sgd to fold two passes into its own: it multiplies every gradient by
  // `grad_scale` as it reads it (clipping's scale, which then needs no pass of its own) and leaves
  // every gradient zero (the next step's zeroing, which the caller then skips). True when this
  // sweep does so for `params`; false (the default, and cuda) when the caller must scale and
  // zero with the passes above. A request holds until that update runs.
  virtual bool fold_into_next_update(const ParamStore& params, float grad_scale) {
    static_cast<void>(params);
    static_cast<void>(grad_scale);
    return false;
  }

  // While set (a CUDA-graph step), the cuda adamw and sgd passes read their constants, the clip
  // scale and the skip decision from `control` (device memory, kernels/step_control.h) instead of
  // their `step` argument. Null clears it. REQUIRES: control outlives its use.
  void set_device_control(const DeviceStepControl* control) { device_control_ = control; }
  const DeviceStepControl* device_control() const { return device_control_; }

 private:
  const DeviceStepControl* device_control_ = nullptr;
};

// Tensor by tensor, in offset order (on cuda: one launch per tensor); holds no state, so one
// serves any store.
std::unique_ptr<ParamSweep> make_per_tensor_sweep();

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every trainable parameter from its gradient, at learning rate `lr`.
  virtual void step(ParamStore& params, float lr) = 0;
  // Named state slots ("exp_avg", ...), each laid out like ParamStore::flat_values() and on its
  // device (params.device() at construction).
  virtual std::vector<std::pair<std::string, Tensor*>> state_slots() = 0;
  // The constants step() would use at `lr` for the step after steps_taken(), into the host copy
  // of a CUDA-graph step's control (kernels/step_control.h); step() itself is then replayed.
  virtual void next_step_constants(float lr, DeviceStepControl* control) const = 0;
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }

 protected:
  int64_t steps_taken_ = 0;
};

// `sweep` carries out every step (shared: the trainer clips and zeroes with the same one).
std::unique_ptr<Optimizer> make_optimizer(
    const OptimizerOptions& options, ParamStore& params,
    std::shared_ptr<ParamSweep> sweep = make_per_tensor_sweep());

struct LrSchedule {
  float peak_lr = 1e-3f, min_lr = 0.0f;
  int warmup_steps = 0, total_steps = 1;
  // Linear warmup over warmup_steps, then cosine decay from peak_lr to min_lr at total_steps.
  float at(int step) const;
};

// The global L2 norm of every trainable gradient, as the sweep sums their squares.
float grad_norm(ParamStore& params, ParamSweep& sweep);
// Returns the global L2 norm of every gradient; scales them down to `max_norm` when it is larger
// (max_norm <= 0: no clipping). Without a sweep: the per-tensor one.
float clip_grad_norm(ParamStore& params, float max_norm, ParamSweep& sweep);
float clip_grad_norm(ParamStore& params, float max_norm);

}  // namespace ft
