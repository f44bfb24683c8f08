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
  std::string trace_path;  // Chrome trace of every variant's first timed rounds; empty = none
};
// Times the variants interleaved, prints a Markdown table; non-zero on a final-loss mismatch.
int run_bench(const BenchArgs& args, Communicator* comm);

struct TuneArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  int budget_steps = 400;  // training steps of all measurements together
  std::string out_path = "runs/tuned.yaml";
  std::string json_path;
};
// The selection loop (app/tune.h): profile, passes one at a time, max_ops, bucket sizes.
int run_tune(const TuneArgs& args, Communicator* comm);

struct SimulateArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string ranks = "8,64,512,4096";
  std::string link = "ib400";  // see app/simulate.h parse_link
  double compute_scale = 1;    // measured compute times are divided by this
  bool validate = false;       // under mpirun: train with the equivalent emulated link, compare
  int steps = 5;               // profiled (and, with --validate, measured) steps
  int warmup = 3;
  std::string json_path;
};
// Predicts iteration time, exposed communication and scaling efficiency at each rank count.
int run_simulate(const SimulateArgs& args, Communicator* comm);

// Threads for this rank: train.threads, or cores / local ranks (at least 1) when it is 0.
int resolve_threads(int configured_threads);

}  // namespace ft
