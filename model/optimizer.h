// Per-tensor optimizers (AdamW, SGD with momentum), the learning-rate schedule and global-norm
// gradient clipping. State tensors mirror the flat parameter buffer, so a parameter's state is a
// view at the same offset, and checkpoints store it per parameter under "optim.<slot>.<name>".
// Thread safety: not synchronised; the training thread owns it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/params.h"

namespace ft {

struct OptimizerOptions {
  std::string name = "adamw";  // adamw | sgd
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.0f;  // applied only to params with Param::weight_decay
  float momentum = 0.9f;
  bool nesterov = false;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every trainable parameter from its gradient, at learning rate `lr`.
  virtual void step(ParamStore& params, float lr) = 0;
  // Named state slots ("exp_avg", ...), each laid out like ParamStore::flat_values().
  virtual std::vector<std::pair<std::string, Tensor*>> state_slots() = 0;
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }

 protected:
  int64_t steps_taken_ = 0;
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, ParamStore& params);

struct LrSchedule {
  float peak_lr = 1e-3f, min_lr = 0.0f;
  int warmup_steps = 0, total_steps = 1;
  // Linear warmup over warmup_steps, then cosine decay from peak_lr to min_lr at total_steps.
  float at(int step) const;
};

// Returns the global L2 norm of every gradient; scales them down to `max_norm` when it is larger
// (max_norm <= 0: no clipping).
float clip_grad_norm(ParamStore& params, float max_norm);

}  // namespace ft
