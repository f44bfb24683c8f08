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

struct PlanArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string mode = "train";  // train | eval
  int batch = 0;               // used when batch_given; else train.batch_size
  bool batch_given = false;
  std::string json_path;  // the whole report as JSON; empty = none
};
// Prints the op list before and after the fusion passes, every pass decision and the totals.
int run_plan(const PlanArgs& args);

struct BenchArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string variants;  // comma-separated names or name:key=value;...; empty = the default list
  bool ablation = false;
  std::string sweep;  // key=v1,v2,...; replaces the variant list
  int steps = 10;     // timed rounds
  int warmup = 2;     // untimed steps of every variant first
  std::string json_path;
};
// Times the variants interleaved, prints a Markdown table; non-zero on a final-loss mismatch.
int run_bench(const BenchArgs& args, Communicator* comm);

// Threads for this rank: train.threads, or cores / local ranks (at least 1) when it is 0.
int resolve_threads(int configured_threads);

}  // namespace ft
