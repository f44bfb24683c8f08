// fusiontrain: command-line entry. Parses the job and its flags with CLI11, starts MPI, and turns
// any error into a message naming the rank plus a non-zero exit of the whole job.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "app/analysis/simulate.h"
#include "app/cli/cli_help.h"
#include "app/cli/flag_checks.h"
#include "app/jobs/bandwidth.h"
#include "app/jobs/jobs.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_runtime.h"
#include "core/check.h"
#include "core/cpu_guard.h"

namespace {

constexpr const char* kDefaultConfig = "configs/gpt_tiny.yaml";

void add_config_flags(CLI::App* job, std::string* config_path,
                      std::vector<std::string>* overrides) {
  job->add_option("--config", *config_path, "YAML config file");
  job->add_option("--set", *overrides, "override a key: section.key=value (repeatable)")
      ->allow_extra_args(false);
}

}  // namespace

int main(int argc, char** argv) {
  // The CPU guard (core/cpu_guard.h) has run by now; this call keeps its object in the link.
  (void)ft::cpu_guard_linked();
  using ft::choice_check;
  using ft::count_check;
  using ft::number_check;
  using ft::peak_check;
  using ft::uint64_check;
  CLI::App app{"fusiontrain: a data-parallel trainer with switchable operator fusion"};
  app.require_subcommand(1);

  ft::TrainArgs train_args;
  train_args.default_config_path = kDefaultConfig;
  train_args.program = argv[0];
  CLI::App* train =
      app.add_subcommand("train", "train a model (run under mpirun for data parallel)");
  add_config_flags(train, &train_args.config_path, &train_args.overrides);
  train->add_option("--json", train_args.json_path, "write per-step metrics as JSON Lines");
  train->add_option("--resume", train_args.resume_path,
                    "continue a run: its run dir (its config.yaml and newest checkpoint, log and "
                    "metrics appended) or a checkpoint (its embedded config unless --config)");

  ft::EvalArgs eval_args;
  CLI::App* eval = app.add_subcommand("eval", "evaluate a checkpoint");
  add_config_flags(eval, &eval_args.config_path, &eval_args.overrides);
  eval->add_option("--checkpoint", eval_args.checkpoint_path, "checkpoint (.safetensors)")
      ->required();
  eval->add_option("--data", eval_args.data_path, "GPT: text file to evaluate");
  eval->add_option("--json", eval_args.json_path, "write the result as JSON");

  ft::PlanArgs plan_args;
  plan_args.config_path = kDefaultConfig;
  CLI::App* plan =
      app.add_subcommand("plan", "print the op list before and after the fusion passes, and why");
  add_config_flags(plan, &plan_args.config_path, &plan_args.overrides);
  plan->add_option("--mode", plan_args.mode, "graph to plan: train or eval (default train)");
  CLI::Option* plan_batch =
      plan->add_option("--batch", plan_args.batch, "batch size (default train.batch_size)");
  plan->add_option("--json", plan_args.json_path, "write the whole report as JSON");

  ft::BandwidthArgs bandwidth_args;
  CLI::App* bandwidth =
      app.add_subcommand("bandwidth", "allreduce bandwidth sweep (run under mpirun)");
  bandwidth
      ->add_option("--min-bytes", bandwidth_args.min_bytes, "smallest message, bytes (4 .. 8 GiB)")
      ->check(number_check(false));
  bandwidth
      ->add_option("--max-bytes", bandwidth_args.max_bytes, "largest message, bytes (up to 8 GiB)")
      ->check(number_check(false));
  bandwidth->add_option("--warmup", bandwidth_args.warmup, "warm-up iterations")
      ->check(count_check(0, 10000));
  bandwidth->add_option("--iters", bandwidth_args.iters, "timed iterations")
      ->check(count_check(1, 100000));
  bandwidth
      ->add_option("--peak-gbps", bandwidth_args.peak_gbps,
                   "peak bandwidth for utilization, GB/s (0 = measure memory bandwidth)")
      ->check(peak_check(1e6));
  bandwidth->add_option("--json", bandwidth_args.json_path, "write the sweep as JSON");
  bandwidth->add_option("--backend", bandwidth_args.backend,
                        "mpi (host buffers, or device buffers staged through pinned memory) or "
                        "nccl (GPU buffers; 1 rank allowed)");
  bandwidth->add_option("--device", bandwidth_args.device,
                        "cpu or cuda: where the reduced buffers live (nccl implies cuda)");
  bandwidth->add_option("--dtype", bandwidth_args.dtype,
                        "fp32 or bf16 (as comm.grad_dtype): the element type reduced");

  ft::BenchArgs bench_args;
  bench_args.config_path = kDefaultConfig;
  CLI::App* bench = app.add_subcommand(
      "bench", "time variants (unfused, horizontal, vertical, ...) interleaved in one run");
  add_config_flags(bench, &bench_args.config_path, &bench_args.overrides);
  bench->add_option("--variants", bench_args.variants,
                    "comma-separated names (unfused,horizontal,vertical,bucketing,overlap,all "
                    "(or fused),all-<pass>,fp32,bf16) or name:key=value;key=value");
  bench->add_flag("--ablation", bench_args.ablation, "add all-<pass> for every pass");
  bench->add_option("--sweep", bench_args.sweep, "key=v1,v2,...: one variant per value");
  bench->add_option("--steps", bench_args.steps, "timed rounds")->check(count_check(1, 100000));
  bench->add_option("--warmup", bench_args.warmup, "untimed steps per variant")
      ->check(count_check(0, 10000));
  bench->add_option("--json", bench_args.json_path, "write the results as JSON");
  bench->add_option("--trace", bench_args.trace_path,
                    "Chrome trace of every variant's first 3 timed rounds (one process each)");
  bench
      ->add_option("--peak-tflops", bench_args.peak_tflops,
                   "per-rank peak TFLOP/s for model FLOP utilisation (MFU); 0 = not reported")
      ->check(peak_check(1e6));

  ft::TuneArgs tune_args;
  tune_args.config_path = kDefaultConfig;
  CLI::App* tune = app.add_subcommand(
      "tune",
      "profile, then keep the fusion passes, max_ops, tile_kb and bucket sizes that measure "
      "faster");
  add_config_flags(tune, &tune_args.config_path, &tune_args.overrides);
  tune->add_option("--budget-steps", tune_args.budget_steps,
                   "training steps of all measurements together (default 400)")
      ->check(count_check(1, 1000000));
  tune->add_option("--out", tune_args.out_path, "chosen config as YAML (default runs/tuned.yaml)");
  tune->add_option("--json", tune_args.json_path, "write every measured point as JSON");

  ft::ExportArgs export_args;
  CLI::App* export_job = app.add_subcommand(
      "export", "write a checkpoint's inference weights (BN folded for a ResNet) as safetensors");
  add_config_flags(export_job, &export_args.config_path, &export_args.overrides);
  export_job->add_option("--checkpoint", export_args.checkpoint_path, "checkpoint (.safetensors)")
      ->required();
  export_job->add_option("--out", export_args.out_path, "export to write (.safetensors)")
      ->required();
  export_job
      ->add_option(
          "--dtype", export_args.dtype,
          "fp32 or bf16: how the tensors are stored; bf16 rounds every fp32 value (the "
          "masters, or a ResNet's folded weights) to nearest, ties to even: half the bytes")
      ->check(choice_check({"fp32", "bf16"}));

  ft::InferArgs infer_args;
  CLI::App* infer =
      app.add_subcommand("infer", "run an exported ResNet over a dataset and time it");
  infer->add_option("--model", infer_args.model_path, "export (.safetensors)")->required();
  infer->add_option("--data", infer_args.data,
                    "'test' (Fashion-MNIST test set, default) or an IDX images file");
  infer->add_option("--labels", infer_args.labels_path, "IDX labels for --data PATH");
  infer->add_option("--batch", infer_args.batch, "images per batch (default 256)")
      ->check(count_check(1, 65536));
  infer->add_option("--threads", infer_args.threads, "threads; 0 = all cores")
      ->check(number_check(true));
  infer->add_option("--limit", infer_args.limit, "first N images only; 0 = all")
      ->check(number_check(true));
  infer->add_option("--compare-unfolded", infer_args.compare_checkpoint,
                    "checkpoint whose unfolded eval model runs on the same batches, interleaved");
  infer->add_option("--json", infer_args.json_path, "write the result as JSON");
  infer->add_option("--device", infer_args.device,
                    "cpu or cuda: where the model runs (cuda needs a GPU; default cpu)");
  infer->add_flag("--profile", infer_args.profile,
                  "time every op: per-kind ms per batch of the export (and of the unfolded model "
                  "with --compare-unfolded); the timing adds a little to every batch");
  infer
      ->add_option(
          "--precision", infer_args.precision,
          "fp32 or bf16: bf16 rounds every convolution's and the fc's operands to bf16 and "
          "sums in fp32, as train.precision: bf16 does (on cpu and cuda; the unfolded model "
          "of --compare-unfolded too). fp32 and bf16 exports both load either way (bf16 "
          "weights widen exactly)")
      ->check(choice_check({"fp32", "bf16"}));

  ft::SimulateArgs simulate_args;
  simulate_args.config_path = kDefaultConfig;
  CLI::App* simulate = app.add_subcommand(
      "simulate", "predict data-parallel scaling from this machine's profile (alpha-beta ring)");
  add_config_flags(simulate, &simulate_args.config_path, &simulate_args.overrides);
  simulate->add_option("--ranks", simulate_args.ranks, "comma-separated rank counts");
  simulate->add_option("--link", simulate_args.link,
                       "assumed figures, not measured: " + ft::link_help());
  simulate->add_option("--compute-scale", simulate_args.compute_scale,
                       "divide measured compute times by this (a faster device)");
  simulate->add_flag("--validate", simulate_args.validate,
                     "under mpirun: predict at the mpirun size, train on the equivalent emulated "
                     "link, compare");
  simulate->add_option("--steps", simulate_args.steps, "profiled / measured steps")
      ->check(count_check(1, 100000));
  simulate->add_option("--warmup", simulate_args.warmup, "untimed steps first")
      ->check(count_check(0, 10000));
  simulate->add_option("--json", simulate_args.json_path, "write the predictions as JSON");

  ft::SampleArgs sample_args;
  CLI::App* sample = app.add_subcommand(
      "sample",
      "generate text from a GPT checkpoint or export with a KV cache, and report tokens/s");
  add_config_flags(sample, &sample_args.config_path, &sample_args.overrides);
  CLI::Option* sample_checkpoint_flag = sample->add_option(
      "--checkpoint", sample_args.checkpoint_path, "training checkpoint (.safetensors)");
  sample
      ->add_option("--model", sample_args.model_path,
                   "GPT export (.safetensors, from `fusiontrain export`), instead of --checkpoint")
      ->excludes(sample_checkpoint_flag);
  sample->add_option("--prompt", sample_args.prompt, "text to continue (default: one newline)");
  int sample_max_new_tokens = 0, sample_top_k = 0;
  double sample_temperature = 0;
  uint64_t sample_seed = 0;
  CLI::Option* sample_max_new_tokens_flag =
      sample
          ->add_option("--max-new-tokens", sample_max_new_tokens,
                       "bytes to generate (default inference.max_new_tokens)")
          ->check(number_check(false));
  CLI::Option* sample_temperature_flag =
      sample
          ->add_option("--temperature", sample_temperature,
                       "0 = greedy (default inference.temperature)")
          ->check(number_check(true));
  CLI::Option* sample_top_k_flag =
      sample
          ->add_option("--top-k", sample_top_k,
                       "keep the k most likely bytes; 0 = all (default inference.top_k)")
          ->check(number_check(true));
  CLI::Option* sample_seed_flag =
      sample->add_option("--seed", sample_seed, "seed of the draws (default train.seed)")
          ->check(uint64_check());
  sample->add_flag("--no-kv-cache", sample_args.no_kv_cache,
                   "recompute the whole window for every new byte");
  sample->add_flag("--compare-no-cache", sample_args.compare_no_cache,
                   "time with and without the KV cache and check both write the same text");
  sample->add_option("--json", sample_args.json_path, "write the text, settings and timings");
  sample
      ->add_option("--precision", sample_args.precision,
                   "fp32 or bf16: bf16 rounds every GEMM's operands to bf16 (the activations and "
                   "bf16 copies of the weights) and sums in fp32, as train.precision: bf16 does; "
                   "LayerNorm, softmax and the residual stream stay fp32. Without bf16 "
                   "instructions the operands are widened and multiplied in fp32 (same values, "
                   "fp32 speed). fp32 and bf16 exports both load either way")
      ->check(choice_check({"fp32", "bf16"}));

  app.set_version_flag("--version", ft::version_text());
  ft::refuse_empty_values(app, {"--prompt"});  // '' is a prompt: a newline
  ft::refuse_non_decimal_integers(app);
  ft::describe_jobs(app);
  std::string unknown_flag_job;
  const std::string unknown_argument =
      ft::unknown_argument_error(app, argc, argv, &unknown_flag_job);
  if (!unknown_argument.empty()) return ft::usage_error(unknown_argument, unknown_flag_job);
  // The config file of the job that runs (jobs without --config have none).
  const std::vector<std::pair<CLI::App*, const std::string*>> config_paths = {
      {train, &train_args.config_path},   {eval, &eval_args.config_path},
      {plan, &plan_args.config_path},     {bench, &bench_args.config_path},
      {tune, &tune_args.config_path},     {simulate, &simulate_args.config_path},
      {sample, &sample_args.config_path}, {export_job, &export_args.config_path}};
  // Every output file, checked on rank 0 (the one that writes them) before any work. JSON is
  // written in place; traces, YAML and exports atomically, creating missing directories.
  struct Output {
    CLI::App* job;
    const char* flag;
    const std::string* path;
    ft::OutputWrite how;
  };
  constexpr ft::OutputWrite kInPlace = ft::OutputWrite::kInPlace,
                            kAtomic = ft::OutputWrite::kAtomic;
  // train's --json may lie in the run directory it creates: run_train checks it.
  const std::vector<Output> outputs = {{eval, "--json", &eval_args.json_path, kInPlace},
                                       {plan, "--json", &plan_args.json_path, kInPlace},
                                       {bandwidth, "--json", &bandwidth_args.json_path, kInPlace},
                                       {bench, "--json", &bench_args.json_path, kInPlace},
                                       {bench, "--trace", &bench_args.trace_path, kAtomic},
                                       {tune, "--json", &tune_args.json_path, kInPlace},
                                       {tune, "--out", &tune_args.out_path, kAtomic},
                                       {export_job, "--out", &export_args.out_path, kAtomic},
                                       {infer, "--json", &infer_args.json_path, kInPlace},
                                       {simulate, "--json", &simulate_args.json_path, kInPlace},
                                       {sample, "--json", &sample_args.json_path, kInPlace}};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return ft::report_parse_error(app, error);
  }
  plan_args.batch_given = plan_batch->count() > 0;
  if (sample_max_new_tokens_flag->count() > 0) sample_args.max_new_tokens = sample_max_new_tokens;
  if (sample_temperature_flag->count() > 0) sample_args.temperature = sample_temperature;
  if (sample_top_k_flag->count() > 0) sample_args.top_k = sample_top_k;
  if (sample_seed_flag->count() > 0) sample_args.seed = sample_seed;

  int rank = 0;
  try {
    // A process that no MPI launcher started runs as one rank without MPI (see
    // MpiRuntime::launched_by_mpi); bandwidth measures MPI itself, so it always initialises it.
    ft::MpiRuntime mpi(&argc, &argv,
                       ft::MpiRuntime::launched_by_mpi() || app.got_subcommand(bandwidth));
    rank = mpi.world_rank();
    try {
      // Under a launcher even one rank gets the communicator: comm.single_rank_allreduce sets the
      // gradient communicator up over it (mpirun -np 1 on a one-GPU machine); at one rank
      // GradSync reduces nothing unless asked.
      std::unique_ptr<ft::MpiCommunicator> comm;
      if (mpi.world_size() > 1 || ft::MpiRuntime::launched_by_mpi() ||
          app.got_subcommand(bandwidth))
        comm = std::make_unique<ft::MpiCommunicator>();
      for (const auto& [job, path] : config_paths)
        if (job->parsed()) ft::require_config_file(*path);
      for (const Output& output : outputs)
        if (rank == 0 && output.job->parsed() && !output.path->empty())
          ft::require_writable_file(output.flag, *output.path, output.how);
      if (app.got_subcommand(train)) return ft::run_train(train_args, comm.get());
      if (app.got_subcommand(eval)) {
        FT_REQUIRE(mpi.world_size() == 1, "eval runs on one rank; drop mpirun -np");
        return ft::run_eval(eval_args);
      }
      if (app.got_subcommand(sample)) {
        if (mpi.world_size() != 1) FT_FAIL("sample runs on one rank; drop mpirun -np");
        return ft::run_sample(sample_args);
      }
      if (app.got_subcommand(plan)) {
        FT_REQUIRE(mpi.world_size() == 1, "plan runs on one rank; drop mpirun -np");
        return ft::run_plan(plan_args);
      }
      if (app.got_subcommand(bench)) return ft::run_bench(bench_args, comm.get());
      if (app.got_subcommand(export_job)) {
        FT_REQUIRE(mpi.world_size() == 1, "export runs on one rank; drop mpirun -np");
        return ft::run_export(export_args);
      }
      if (app.got_subcommand(infer)) {
        FT_REQUIRE(mpi.world_size() == 1, "infer runs on one rank; drop mpirun -np");
        return ft::run_infer(infer_args);
      }
      if (app.got_subcommand(simulate)) return ft::run_simulate(simulate_args, comm.get());
      if (app.got_subcommand(tune)) return ft::run_tune(tune_args, comm.get());
      if (app.got_subcommand(bandwidth)) return ft::run_bandwidth(*comm, bandwidth_args);
    } catch (const ft::CollectiveError& error) {
      // Every rank stops here together: one report, and a clean exit instead of an abort.
      if (rank == 0) std::fprintf(stderr, "rank 0: error: %s\n", error.what());
      return 1;
    } catch (const ft::UsageError& error) {
      // A bad flag found by a job: the exit status of every usage error, CLI11's included.
      std::fprintf(stderr, "rank %d: error: %s\n", rank, error.what());
      std::fflush(stderr);
      if (mpi.world_size() > 1) ft::MpiRuntime::abort(2);
      return 2;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "rank %d: error: %s\n", rank, error.what());
      std::fflush(stderr);
      if (mpi.world_size() > 1) ft::MpiRuntime::abort(1);
      return 1;
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, error.what());
    return 1;
  }
  return 0;
}
