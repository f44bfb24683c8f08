// Trainer: one data-parallel training run. Owns the parameters, the training graph, the
// parameter sweep, the optimizer and the gradient synchroniser, and drives a Task through optimizer
// steps: forward → backward (gradients announced to comm/ as they become final) → bucket allreduce
// → clip → optimizer. Checkpoints save and restore everything needed for a bitwise-exact resume.
// Thread safety: one training thread per rank drives a Trainer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "app/config.h"
#include "app/task.h"
#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "model/optimizer.h"

namespace ft {

struct StepStats {
  int step = 0;  // 1-based number of the optimizer step just taken
  float loss = 0.0f;
  float lr = 0.0f;
  float grad_norm = 0.0f;
  double step_ms = 0.0;
  double compute_ms = 0.0;  // step time minus exposed communication
  CommStepStats comm;
};

class Trainer {
 public:
  // `comm` may be null: a single process that never communicates. REQUIRES: comm outlives this.
  Trainer(const Config& config, Communicator* comm);
  ~Trainer();

  StepStats train_step();
  // Validation loss (GPT) or test accuracy (ResNet) on this rank's view of the eval data.
  EvalResult evaluate(int max_batches);

  // Rank 0 writes; every rank may load. Atomic: temp file, fsync, rename.
  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path);

  int step() const { return step_; }
  const Config& config() const { return config_; }
  ParamStore& params() { return params_; }
  Task& task() { return *task_; }
  Executor& executor() { return *train_run_->executor; }
  GradSync* grad_sync() { return grad_sync_.get(); }  // null without a communicator
  int64_t items_per_step() const;                     // over all ranks and micro-batches

 private:
  Config config_;
  Communicator* comm_;
  int world_size_ = 1;
  std::unique_ptr<Task> task_;
  ParamStore params_;
  std::unique_ptr<GraphCache> graphs_;
  GraphRun* train_run_ = nullptr;
  // Every pass over the flat buffers (step, clip, zero): chunked when
  // fusion.horizontal.multi_tensor is on, else per tensor. Shared with optimizer_.
  std::shared_ptr<ParamSweep> sweep_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<GradSync> grad_sync_;
  LrSchedule schedule_;
  int step_ = 0;
};

// Reads a checkpoint's parameters (and buffers) into `params` by name; used by eval and infer.
// Throws ft::Error naming the file and the first missing or mis-shaped tensor.
void load_checkpoint_params(const std::string& path, ParamStore& params);
// The config a checkpoint was trained with (its metadata), with `overrides` applied.
Config checkpoint_config(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace ft
