// Run configuration: plain structs with defaults, read strictly from YAML and `--set` overrides.
// One field schema (app/config/config_schema.cpp) drives parsing, overrides, validation, printing,
// flattening and docs/config_reference.md, so a key exists in all of them or in none.
// Every problem (unknown key, wrong type, out of range, bad combination, a key set although the
// chosen model.arch or optim.name never reads it) throws ft::Error naming the file:line:col or the
// override, the key, and what is allowed.
// Thread safety: all functions are pure apart from reading the named file; safe from any thread.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fusion/pass.h"

namespace ft {

struct ModelConfig {
  std::string arch = "gpt";  // gpt | resnet
  int n_layer = 4;
  int n_head = 4;
  int d_model = 128;
  int seq_len = 64;
  int vocab_size = 256;
  float dropout = 0.0f;
  bool qk_norm = false;
  int resnet_blocks = 1;  // n in ResNet-(6n+2)
  int resnet_width = 16;
  std::string conv_algorithm = "auto";  // auto | onednn
};

struct TrainConfig {
  int steps = 300;
  int batch_size = 8;  // per rank
  uint64_t seed = 1337;
  int threads = 0;  // 0 = cores / local ranks, at least 1
  int eval_every = 100;
  int eval_batches = 20;
  int log_every = 10;
  std::string run_dir = "";         // empty = runs/<config stem>-<timestamp>, runs/latest -> it
  std::string checkpoint_dir = "";  // empty = <run_dir>/checkpoints
  int checkpoint_every = 0;         // steps; 0 = only at the end
  std::string resume = "";          // checkpoint path, empty = fresh start
  int grad_accum = 1;
  std::string device = "cpu";  // cpu | cuda
  bool tf32 = false;           // cuda GEMMs with TF32 inputs; false keeps fp32 (CPU-equal rounding)
  std::string precision = "fp32";  // fp32 | bf16: GEMM operands in bf16, fp32 masters
  bool verbose = false;    // progress lines add lr, grad norm and communication details (ranks > 1)
  bool profile = false;    // per-op time table (rank 0) and fusion advice at the end of the run
  std::string trace = "";  // Chrome trace-event JSON of a few steps after warm-up; empty = none
  std::string nan_policy = "stop";  // stop | skip_step: what a non-finite loss or gradient does
  int max_skipped_steps = 10;       // skip_step: stop after more skips than this
  bool overwrite = false;           // a fresh run may write into a dir holding checkpoints
};

struct OptimConfig {
  std::string name = "adamw";  // adamw | sgd
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int warmup_steps = 20;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float momentum = 0.9f;
  bool nesterov = false;
  float grad_clip = 1.0f;  // 0 = off
};

struct DataConfig {
  std::string path = "data/moby_dick.txt";
  float val_fraction = 0.1f;
  bool shuffle = true;
  std::string augment = "none";  // none | flip
  std::string mnist_dir = "/usr/share/datasets/fashion-mnist";
  int test_limit = 0;  // 0 = all test images
};

// The fusion.* keys are fusion/pass.h's FusionOptions, so passes read exactly what the file says.
using FusionConfig = FusionOptions;

struct EmulateConfig {
  double latency_us = 0;
  double bandwidth_gbps = 0;
};  // both 0 = off

struct CommConfig {
  std::string backend = "auto";  // auto | mpi | nccl
  bool bucketing = true;
  double bucket_mb = 4;
  double first_bucket_mb = 1;
  bool bucket_view = true;
  bool overlap = true;
  bool reorder_buckets = false;
  bool deterministic = false;  // true: rank-order sums, bitwise independent of bucketing
  double timeout_s = 600;      // a blocking wait on other ranks longer than this ends the run
  bool single_rank_allreduce = false;  // GradSyncOptions::single_rank_allreduce
  std::string grad_dtype = "fp32";     // fp32 | bf16: GradSyncOptions::grad_dtype
  EmulateConfig emulate;
};

// The checkpoint is no key: sample, eval and export take it as --checkpoint FILE.
struct InferenceConfig {
  int max_new_tokens = 200;
  float temperature = 1.0f;
  int top_k = 0;
  // inference.fold_bn is FusionOptions::fold_bn (config.fusion.fold_bn).
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  OptimConfig optim;
  DataConfig data;
  FusionConfig fusion;
  CommConfig comm;
  InferenceConfig inference;
  std::string source_path;  // file it was read from
};

// Config files larger than this are refused (4 MiB; real ones are a few hundred bytes).
inline constexpr uint64_t kMaxConfigBytes = uint64_t{4} << 20;

// Reads `path` strictly, then applies `overrides` ("section.key=value", nested:
// "comm.emulate.latency_us=20") in order, then validates. Throws ft::Error on any problem.
// A defaulted optim.warmup_steps longer than train.steps is lowered to train.steps, with a
// one-line note on stdout; a warmup the file or an override set stays an error.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// A relative `data_path` that is not there from the working directory is looked up from the
// folder of `config_path` and each folder above it, so configs/x.yaml of a checkout finds the
// checkout's data/ from anywhere; the first hit, or `data_path` unchanged. load_config applies it
// to data.path.
std::string find_data_file(const std::string& data_path, const std::string& config_path);

// Same, from YAML text (for tests); `origin` is used as the file name in messages.
Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});

// The resolved config with every key, re-parseable by parse_config.
std::string config_to_yaml(const Config& config);

// Every key in a fixed (declaration) order: {"model.arch","gpt"}, {"model.n_layer","4"}, ...
std::vector<std::pair<std::string, std::string>> flatten_config(const Config& config);

// Markdown tables (key, type, default, allowed, meaning), one per section; the content of
// docs/config_reference.md, which a test keeps equal to this.
std::string config_reference_markdown();

}  // namespace ft
