// The jobs behind `fusiontrain <job>`: each takes parsed options and returns an exit status.
// Errors surface as ft::Error; main() prints them and ends every rank.
// Thread safety: run from main() only.
#pragma once
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ft {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string json_path;  // per-step JSON Lines plus a summary; empty = none
};
// `comm` is null for a single process.
int run_train(const TrainArgs& args, Communicator* comm);

struct EvalArgs {
  std::string config_path;  // optional: defaults to the checkpoint's embedded config
  std::vector<std::string> overrides;
  std::string checkpoint_path;
  std::string data_path;  // GPT: evaluate this text file instead of the validation split
  std::string json_path;
};
int run_eval(const EvalArgs& args);

// Threads for this rank: train.threads, or cores / local ranks (at least 1) when it is 0.
int resolve_threads(int configured_threads);

}  // namespace ft
