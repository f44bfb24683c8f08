// Which config `fusiontrain train` runs with, resume included. `--resume RUN_DIR` (or
// train.resume: RUN_DIR) continues a run from its folder: the run's config.yaml, its newest
// checkpoint, the same run dir (log.txt and metrics.jsonl appended). `--resume CHECKPOINT`
// without --config takes the config embedded in the checkpoint, as eval, export and sample do.
// A resumed run keeps its model and optimizer: a model.* key or optim.name that differs from the
// run's is refused naming both values. Resumed on another number of ranks, the global batch is
// kept (train.grad_accum or train.batch_size adjusted, with a note) or the resume is refused
// with the numbers.
// Thread safety: none needed; every rank calls it once before training, on the same files.
#pragma once
#include <string>
#include <vector>

#include "app/config/config.h"

namespace ft {

struct TrainConfigRequest {
  std::string config_path;  // --config; "" when not given
  std::string default_config_path;
  std::vector<std::string> overrides;  // --set
  std::string resume_path;             // --resume; "" when not given
};

struct ResolvedTrainConfig {
  Config config;
  std::vector<std::string> notes;  // for rank 0 to print, one line each
};

// REQUIRES: world_size >= 1. Throws ft::Error naming the file and key on any problem.
ResolvedTrainConfig resolve_train_config(const TrainConfigRequest& request, int world_size);

// The newest step_*.safetensors in `checkpoint_dir`, or "" when it holds none.
std::string newest_checkpoint(const std::string& checkpoint_dir);

// The command that continues the run in `run_dir` on `world_size` ranks, `program` being how
// this one was started (argv[0]).
std::string resume_command(const std::string& program, const std::string& run_dir, int world_size);

}  // namespace ft
