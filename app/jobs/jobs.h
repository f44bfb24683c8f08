// The jobs behind `fusiontrain <job>`: each takes parsed options and returns an exit status.
// Errors surface as ft::Error; main() prints them and ends every rank.
// Thread safety: run from main() only.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace ft {

struct TrainArgs {
  std::string config_path;          // "" when --config is not given
  std::string default_config_path;  // used when neither --config nor a resume names one
  std::vector<std::string> overrides;
  std::string json_path;                // per-step JSON Lines plus a summary; empty = none
  std::string resume_path;              // --resume RUN_DIR or CHECKPOINT; "" = train.resume decides
  std::string program = "fusiontrain";  // argv[0], for the resume hint
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
  double peak_tflops = 0;  // per-rank peak for MFU; 0 = not reported
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
// The selection loop (app/analysis/tune.h): profile, passes one at a time, max_ops, bucket sizes.
int run_tune(const TuneArgs& args, Communicator* comm);

struct SimulateArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string ranks = "8,64,512,4096";
  std::string link = "ib400";  // see app/analysis/simulate.h parse_link
  double compute_scale = 1;    // measured compute times are divided by this
  bool validate = false;       // under mpirun: train with the equivalent emulated link, compare
  int steps = 5;               // profiled (and, with --validate, measured) steps
  int warmup = 3;
  std::string json_path;
};
// Predicts iteration time, exposed communication and scaling efficiency at each rank count.
int run_simulate(const SimulateArgs& args, Communicator* comm);

struct ExportArgs {
  std::string checkpoint_path;
  std::string config_path;  // optional: defaults to the checkpoint's embedded config
  std::vector<std::string> overrides;
  std::string out_path;
  std::string dtype = "fp32";  // fp32 | bf16: how the tensors are stored (bf16: rounded RNE)
};
// Writes the inference weights (BN folded for a ResNet) as safetensors
// (app/inference/inference_model.h).
int run_export(const ExportArgs& args);

struct InferArgs {
  std::string model_path;     // an export
  std::string data = "test";  // "test" (Fashion-MNIST) or an IDX images file
  std::string labels_path;    // IDX labels for --data PATH; empty = none (no accuracy)
  int batch = 256;
  int threads = 0;                 // 0 = all cores
  int limit = 0;                   // images; 0 = all
  std::string compare_checkpoint;  // also run the unfolded eval model of this checkpoint
  std::string json_path;
  std::string device = "cpu";  // cpu | cuda: where the model and every batch run
  bool profile = false;  // per-kind op times of each model (app/inference/inference_profile.h)
  std::string precision = "fp32";  // fp32 | bf16: the GEMMs' and convolutions' operands (cpu)
};
// Runs an export over a dataset: accuracy, loss, latency per batch, images/s.
int run_infer(const InferArgs& args);

struct SampleArgs {
  std::string config_path;  // optional: defaults to the checkpoint's (or export's) embedded config
  std::vector<std::string> overrides;
  std::string checkpoint_path;        // a training checkpoint, or
  std::string model_path;             // a GPT export (fusiontrain export): exactly one of the two
  std::string prompt;                 // bytes; empty = a single newline byte
  std::optional<int> max_new_tokens;  // unset = inference.max_new_tokens
  // Unset = inference.temperature; 0 = greedy. A double, as typed: 1e-50 is refused, not a
  // float 0 that would turn sampling greedy.
  std::optional<double> temperature;
  std::optional<int> top_k;       // unset = inference.top_k; 0 = no truncation
  std::optional<uint64_t> seed;   // unset = train.seed
  bool no_kv_cache = false;       // recompute the whole window for every new byte
  bool compare_no_cache = false;  // time both ways, check they write the same text
  std::string json_path;
  // fp32 | bf16: bf16 multiplies bf16 operands (the activations and bf16 copies of the weights)
  // in the GEMMs train.precision: bf16 runs in bf16 (model/gpt_decode.h lists them).
  std::string precision = "fp32";
};
// GPT only: generates bytes after the prompt with the KV-cache decoder and prints the text and
// tokens/s (model/gpt_sample.h describes the context window and its re-primes).
int run_sample(const SampleArgs& args);

// Threads for this rank: train.threads, or cores / local ranks (at least 1) when it is 0.
int resolve_threads(int configured_threads);

}  // namespace ft
