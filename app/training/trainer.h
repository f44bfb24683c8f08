// Trainer: one data-parallel training run. Owns the parameters, the training graph, the
// parameter sweep, the optimizer and the gradient synchroniser, and drives a Task through optimizer
// steps: forward → backward (gradients announced to comm/ as they become final) → bucket allreduce
// → clip → optimizer. Checkpoints save and restore everything needed for a bitwise-exact resume.
// Divergence guard: a step whose loss or gradient norm is not finite (on any rank) never reaches
// the optimizer; by train.nan_policy it stops the run (ft::Error naming the step, the value and
// the last good checkpoint) or is skipped, up to train.max_skipped_steps. A checkpoint is never
// written from a non-finite state, and loading one checks every tensor and counter.
// Thread safety: one training thread per rank drives a Trainer.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/training/task.h"
#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "core/safetensors.h"
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
  // The loss or gradient norm was not finite (on some rank): no optimizer update this step
  // (train.nan_policy: skip_step; under stop train_step throws instead).
  bool skipped = false;
};

class Trainer {
 public:
  // `comm` may be null: a single process that never communicates. REQUIRES: comm outlives this.
  Trainer(const Config& config, Communicator* comm);
  ~Trainer();

  // Throws ft::Error when the step diverges and train.nan_policy says stop, or when it is one skip
  // more than train.max_skipped_steps; the parameters are then those before the step. Collective
  // under a communicator: every rank takes the same decision at the same step.
  StepStats train_step();
  // Validation loss (GPT) or test accuracy (ResNet) on this rank's view of the eval data.
  EvalResult evaluate(int max_batches);

  // Rank 0 writes; every rank may load. Atomic: temp file, fsync, rename. Every rank throws
  // ft::Error, writing nothing, when a parameter or optimizer state is not finite. The first save
  // into a directory removes the temp files that dead writers left there.
  void save_checkpoint(const std::string& path);
  // Throws ft::Error naming the file and the defect: wrong format, a non-finite tensor, a missing,
  // extra or mis-shaped tensor, or "step" / "optimizer_steps" not an integer in range
  // (0 <= optimizer_steps <= step <= train.steps).
  void load_checkpoint(const std::string& path);

  // fusion.cuda_graph: this many ordinary steps (which allocate every buffer, choose cuDNN
  // algorithms and settle the bucket order) come before the step that is captured.
  static constexpr int kEagerStepsBeforeCapture = 2;

  int step() const { return step_; }
  int skipped_steps() const { return skipped_steps_; }  // over the whole run, resumes included
  // Where the last save went ("" before the first); "last good checkpoint: ..." for messages.
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  std::string last_checkpoint_text() const;
  const Config& config() const { return config_; }
  ParamStore& params() { return params_; }
  Task& task() { return *task_; }
  // For trainers that only measure steps (bench, simulate): their errors then say that the job
  // writes no checkpoints instead of "no checkpoint written yet". Default true.
  void set_writes_checkpoints(bool writes) { writes_checkpoints_ = writes; }
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
  // The last optimizer step left every gradient zero (ParamSweep::fold_into_next_update), so the
  // next step needs no zeroing pass.
  bool grads_zeroed_ = false;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Communicator> device_comm_;  // NCCL, when the gradients reduce on the GPU
  std::unique_ptr<GradSync> grad_sync_;
  LrSchedule schedule_;
  int step_ = 0;
  int skipped_steps_ = 0;
  Tensor buffers_before_step_;  // train.nan_policy skip_step: restored when a step is skipped
  std::string last_checkpoint_;
  bool writes_checkpoints_ = true;
  std::set<std::string> cleaned_dirs_;  // directories already rid of stale temp files

  // Puts this rank's data stream where the checkpoint left it: its stored data state, or (an
  // older checkpoint, another world size) a bounded replay of step_ batches.
  void restore_data_position(const SafetensorsFile& file, const std::string& path);
  // The dropout seed of micro-batch `micro` of the coming step: a function of (seed, step,
  // micro-batch) only, so a resumed run draws the same masks.
  uint64_t dropout_seed(int micro) const;
  // True when `locally_finite` is false on any rank (collective under a communicator).
  bool any_rank_diverged(bool locally_finite);
  // A step that diverged: stats.skipped, BatchNorm buffers restored, or ft::Error by
  // train.nan_policy and train.max_skipped_steps. `locally_finite`: only another rank diverged.
  void skip_diverged_step(StepStats& stats, bool locally_finite);

  // fusion.cuda_graph (app/training/trainer_graph.cpp): after kEagerStepsBeforeCapture ordinary
  // steps the next step is captured as one CUDA graph, and every step from then on replays it.
  struct GraphStep;  // the graph and its device step control; defined in trainer_graph.cpp
  struct GraphStepDeleter {
    void operator()(GraphStep* step) const;
  };
  bool graph_steps_ = false;
  int eager_steps_ = 0;  // ordinary steps taken by this Trainer
  std::unique_ptr<GraphStep, GraphStepDeleter> graph_step_;
  // Throws ft::Error when cuda_graph cannot work with this run's gradient reduction.
  void check_graph_steps_supported() const;
  StepStats graph_train_step();
  void capture_graph_step();
  // What a checkpoint holds, on the host: the flat buffers themselves on cpu, copies on cuda.
  struct HostState {
    Tensor values, buffers;
    std::vector<std::pair<std::string, Tensor>> optimizer;  // slot name, flat state
    const float* param_data(const Param& param) const;
  };
  HostState host_state();
  void require_finite_state(const std::string& path, const HostState& host) const;
};

// A checkpoint file, read and checked: fusiontrain format, every tensor finite. Throws ft::Error
// naming the file and the defect.
SafetensorsFile load_checkpoint_file(const std::string& path);
// The checks load_checkpoint_file makes, on a file already read from `path`.
void require_checkpoint(const SafetensorsFile& file, const std::string& path);
// Reads a checkpoint's parameters (and buffers) into `params` by name; used by eval and infer.
// Throws ft::Error naming the file and the first missing or mis-shaped tensor, or listing the
// tensors `params` does not have (optimizer state "optim.<slot>.<param>" of a known param aside).
void load_checkpoint_params(const std::string& path, ParamStore& params);
// Throws, naming `path`, unless `file` holds every parameter registered in `params` with its
// shape and nothing else. Needs no allocation: call it first, so that metadata describing a huge
// model with no tensors to match is refused before the model is allocated.
void require_checkpoint_tensors(const SafetensorsFile& file, const std::string& path,
                                const ParamStore& params);
// Same, from a file already read by load_checkpoint_file; `path` names it in errors.
void load_checkpoint_params(const SafetensorsFile& file, const std::string& path,
                            ParamStore& params);
// The config a checkpoint was trained with (its metadata), with `overrides` applied.
Config checkpoint_config(const std::string& path, const std::vector<std::string>& overrides);
Config checkpoint_config(const SafetensorsFile& file, const std::string& path,
                         const std::vector<std::string>& overrides);

}  // namespace ft
