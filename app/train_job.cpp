// `fusiontrain train`: the training loop with progress lines, periodic evaluation, JSON Lines
// metrics and atomic checkpoints.
#include <omp.h>

#include <algorithm>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/fusion_advice.h"
#include "app/jobs.h"
#include "app/profiler.h"
#include "app/resume.h"
#include "app/run_layout.h"
#include "app/throughput.h"
#include "app/trace.h"
#include "app/trainer.h"
#include "comm/startup.h"
#include "core/check.h"
#include "core/gemm.h"
#include "core/safetensors.h"
#include "core/timer.h"

namespace ft {
namespace {

// Rank 0's progress lines go to stdout and to <run_dir>/log.txt.
std::FILE* progress_log = nullptr;

__attribute__((format(printf, 1, 2))) void say(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  if (progress_log != nullptr) {
    va_start(args, format);
    std::vfprintf(progress_log, format, args);
    va_end(args);
    std::fflush(progress_log);
  }
  std::fflush(stdout);
}

nlohmann::json step_json(const StepStats& stats, int64_t items) {
  nlohmann::json row = {{"type", "step"},
                        {"step", stats.step},
                        {"loss", stats.loss},
                        {"lr", stats.lr},
                        {"grad_norm", stats.grad_norm},
                        {"step_ms", stats.step_ms},
                        {"compute_ms", stats.compute_ms},
                        {"items", items},
                        {"comm_ms", stats.comm.comm_ms},
                        {"exposed_comm_ms", stats.comm.exposed_ms},
                        {"allreduce_calls", stats.comm.allreduce_calls},
                        {"bytes_reduced", stats.comm.bytes_reduced},
                        {"buckets", stats.comm.bucket_bytes.size()},
                        {"bucket_bytes", stats.comm.bucket_bytes},
                        {"extra_comm_memory_bytes", stats.comm.extra_memory_bytes}};
  if (stats.comm.emulated) row["link"] = "emulated link";
  if (stats.skipped) row["skipped"] = true;
  return row;
}

nlohmann::json eval_json(const EvalResult& result, int step) {
  nlohmann::json row = {
      {"type", "eval"}, {"step", step}, {"loss", result.loss}, {"examples", result.examples}};
  if (result.accuracy >= 0) row["accuracy"] = result.accuracy;
  if (result.bits_per_byte >= 0) row["bits_per_byte"] = result.bits_per_byte;
  return row;
}

void print_eval(const EvalResult& result, int step) {
  if (result.accuracy >= 0)
    say("eval  step %d | test loss %.4f | test accuracy %.2f%% (%lld images)\n", step, result.loss,
        100.0 * result.accuracy, static_cast<long long>(result.examples));
  else
    say("eval  step %d | val loss %.4f | %.4f bits/byte (%lld windows)\n", step, result.loss,
        result.bits_per_byte, static_cast<long long>(result.examples));
  std::fflush(stdout);
}

// The signal that asked the run to stop on any rank (SIGINT when ranks got different ones), or
// 0. Collective: every rank stops after the same step.
int agreed_interrupt(Communicator* comm) {
  const int local = InterruptHandlers::requested();
  if (comm == nullptr) return local;
  float votes[2] = {local == SIGINT ? 1.0f : 0.0f, local == SIGTERM ? 1.0f : 0.0f};
  comm->allreduce(votes, 2, ReduceOp::kSum);
  return votes[0] > 0 ? SIGINT : votes[1] > 0 ? SIGTERM : 0;
}

}  // namespace

int resolve_threads(int configured_threads) {
  if (configured_threads > 0) return configured_threads;
  const char* local_size_env = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int local_ranks = local_size_env ? std::max(1, std::atoi(local_size_env)) : 1;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local_ranks);
}

int run_train(const TrainArgs& args, Communicator* comm) {
  const bool is_root = comm == nullptr || comm->rank() == 0;
  const int world_size = comm ? comm->size() : 1;
  const ResolvedTrainConfig request = resolve_train_config(
      {args.config_path, args.default_config_path, args.overrides, args.resume_path}, world_size);
  const Config& loaded = request.config;
  if (is_root)
    for (const std::string& note : request.notes) std::printf("%s\n", note.c_str());
  omp_set_num_threads(resolve_threads(loaded.train.threads));
  // A config that differs across ranks is the first thing to report (the Trainer checks again).
  if (comm != nullptr) check_same_config(*comm, flatten_config(loaded), loaded.source_path);
  const Config config = resolve_run_layout(loaded, comm, is_root);
  // resolve_run_layout created an automatically named run dir; a run that stops before writing
  // into it (a bad or finished train.resume) takes it away again. remove() deletes only an empty
  // directory, so a run that wrote there keeps it.
  struct RemoveIfEmpty {
    std::string path;
    ~RemoveIfEmpty() {
      std::error_code error;
      if (!path.empty()) std::filesystem::remove(path, error);
    }
  } claimed_run_dir{is_root && loaded.train.run_dir.empty() ? config.train.run_dir : ""};
  if (is_root) require_writable_run_layout(config, args.json_path);
  const std::string resolved = config_to_yaml(config);
  refuse_to_overwrite(config, comm, is_root);

  // Before anything is written: loading train.resume checks the checkpoint.
  Trainer trainer(config, comm);
  if (trainer.step() >= config.train.steps) {
    if (is_root)
      std::printf("%s: already finished at step %d; nothing to do (raise train.steps to go on)\n",
                  config.train.resume.c_str(), trainer.step());
    return 0;
  }
  JsonLinesFile json, metrics;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log_file(nullptr, &std::fclose);
  struct DetachLog {  // destroyed before log_file: say() never writes to a closed file
    ~DetachLog() { progress_log = nullptr; }
  } detach_log;
  const bool resumed = !config.train.resume.empty();
  // A resume adds to the run's history: metrics.jsonl and log.txt are appended to, and when the
  // run dir already has a config.yaml (the run's start) this part's config goes next to it.
  std::string config_name = "config.yaml";
  if (is_root) {
    const std::filesystem::path run_dir(config.train.run_dir);
    std::error_code error;
    if (resumed && std::filesystem::exists(run_dir / config_name, error))
      config_name = "config.resume-" + std::to_string(trainer.step()) + ".yaml";
    write_file_atomic((run_dir / config_name).string(), resolved);
    if (loaded.train.run_dir.empty()) point_latest_at(config.train.run_dir);
    metrics.open((run_dir / "metrics.jsonl").string(), resumed);
    if (!args.json_path.empty()) json.open(args.json_path);
    log_file.reset(std::fopen((run_dir / "log.txt").string().c_str(), "a"));
    FT_REQUIRE(log_file != nullptr, "cannot open '", (run_dir / "log.txt").string(),
               "' for writing");
    progress_log = log_file.get();
    const int64_t parameters = trainer.params().num_trainable_floats();
    say("%s: %s, %.2fM parameters, %lld %s per step (%lld per rank), %d rank%s x %d thread%s\n",
        config.source_path.c_str(),
        config.model.arch == "gpt"
            ? ("gpt " + std::to_string(config.model.n_layer) + "x" +
               std::to_string(config.model.d_model) + ", seq_len " +
               std::to_string(config.model.seq_len))
                  .c_str()
            : ("resnet" + std::to_string(6 * config.model.resnet_blocks + 2) + " width " +
               std::to_string(config.model.resnet_width))
                  .c_str(),
        parameters / 1e6, static_cast<long long>(trainer.items_per_step()),
        trainer.task().item_unit(), static_cast<long long>(trainer.items_per_step() / world_size),
        world_size, world_size == 1 ? "" : "s", omp_get_max_threads(),
        omp_get_max_threads() == 1 ? "" : "s");
    say("settings:%s\nrun dir %s (%s, log.txt, metrics.jsonl), checkpoints in %s\n",
        non_default_settings(config).c_str(), config.train.run_dir.c_str(), config_name.c_str(),
        config.train.checkpoint_dir.c_str());
    // Once per run: whether bf16 pays on this CPU, so a slow bf16 run is never a mystery.
    if (config.train.precision == "bf16")
      say("precision bf16: GEMM operands in bf16, fp32 masters and reductions; %s\n",
          config.train.device == "cuda" ? "cuBLASLt bf16 GEMMs on the GPU" : bf16_gemm_path());
  }
  // Every JSON row goes to metrics.jsonl and, with --json, to that file too, flushed at once: a
  // run that is killed keeps every finished step's row, whole.
  const auto emit = [&](const nlohmann::json& row) {
    if (metrics.is_open()) metrics.write(row, true);
    if (json.is_open()) json.write(row, true);
  };
  // train.profile: rank 0 only; warm-up shortened so that a short run still measures a step.
  std::unique_ptr<Profiler> profiler;
  if (is_root && config.train.profile) {
    const int steps_to_run = config.train.steps - trainer.step();
    profiler = std::make_unique<Profiler>(
        trainer.executor().graph(), std::max(0, std::min(kProfileWarmupSteps, steps_to_run - 1)));
    trainer.executor().set_observer(profiler.get());
  }
  // Collective when train.trace is set; passes every op on to the profiler while it observes.
  TrainTrace trace(config.train.trace, trainer, comm, profiler.get());
  const int64_t items_per_step = trainer.items_per_step();
  const int total_steps = config.train.steps;
  const int first_step = trainer.step();
  double train_ms = 0.0;
  float last_loss = 0.0f;
  bool emulated_link = false;
  CommStepStats comm_totals;  // summed over steps, for the summary
  EvalResult last_eval;
  bool evaluated = false;
  const auto evaluate = [&](int step) {
    if (!is_root) return;
    last_eval = trainer.evaluate(config.train.eval_batches);
    evaluated = true;
    print_eval(last_eval, step);
    emit(eval_json(last_eval, step));
  };
  std::string last_checkpoint;
  // SIGINT/SIGTERM: the run stops after the step in progress, saves it and says how to resume.
  InterruptHandlers interrupt(is_root, log_file ? fileno(log_file.get()) : -1);
  const std::string resume_hint = resume_command(args.program, config.train.run_dir, world_size);
  interrupt.update(first_step, config.train.resume, resume_hint);
  double interval_ms = 0;  // steps since the last progress line
  int interval_steps = 0;
  const double start_ms = now_ms();

  while (trainer.step() < total_steps) {
    trace.before_step();
    if (profiler) profiler->begin_step();
    StepStats stats;
    try {
      stats = trainer.train_step();
    } catch (const CollectiveError& error) {
      // A run stopped by divergence goes on from its newest checkpoint, the last good one.
      if (newest_checkpoint(config.train.checkpoint_dir).empty()) throw;
      throw CollectiveError(std::string(error.what()) + "; resume with: " + resume_hint);
    }
    if (profiler) profiler->end_step(stats.step_ms);
    trace.after_step(stats.comm);
    train_ms += stats.step_ms;
    last_loss = stats.loss;
    emulated_link = emulated_link || stats.comm.emulated;
    comm_totals.comm_ms += stats.comm.comm_ms;
    comm_totals.exposed_ms += stats.comm.exposed_ms;
    comm_totals.allreduce_calls += stats.comm.allreduce_calls;
    comm_totals.bytes_reduced += stats.comm.bytes_reduced;
    comm_totals.bucket_bytes = stats.comm.bucket_bytes;
    comm_totals.extra_memory_bytes = stats.comm.extra_memory_bytes;
    const int step = stats.step;
    if (is_root) emit(step_json(stats, items_per_step));
    interrupt.update(step, last_checkpoint.empty() ? config.train.resume : last_checkpoint,
                     resume_hint);
    if (is_root && stats.skipped)
      say("step %d/%d | loss %g, gradient norm %g: update skipped (%d skipped so far, "
          "train.max_skipped_steps %d)\n",
          step, total_steps, stats.loss, stats.grad_norm, trainer.skipped_steps(),
          config.train.max_skipped_steps);
    interval_ms += stats.step_ms;
    ++interval_steps;
    const bool log_now = step == first_step + 1 || step == total_steps ||
                         (config.train.log_every > 0 && step % config.train.log_every == 0);
    if (is_root && log_now) {
      // ms/step averages the steps since the last line; the ETA uses the whole run's average.
      const double ms_per_step = interval_ms / interval_steps;
      const double eta_s = train_ms / (step - first_step) * (total_steps - step) / 1e3;
      say("step %d/%d | loss %.4f | %.1f ms/step | %s %s/s | %s elapsed | ETA %s\n", step,
          total_steps, stats.loss, ms_per_step,
          human_rate(items_per_step / (ms_per_step / 1e3)).c_str(), trainer.task().item_unit(),
          clock_text((now_ms() - start_ms) / 1e3).c_str(), clock_text(eta_s).c_str());
      // train.verbose: this step's lr and gradient norm (before clipping), and with several
      // ranks the communication of this step.
      if (config.train.verbose && world_size > 1)
        say("  lr %.2e | grad norm %.4g | compute %.1f ms, comm %.1f ms, exposed %.1f ms, %lld "
            "allreduce, %.2f MB, %zu buckets%s\n",
            stats.lr, stats.grad_norm, stats.compute_ms, stats.comm.comm_ms, stats.comm.exposed_ms,
            static_cast<long long>(stats.comm.allreduce_calls), stats.comm.bytes_reduced / 1e6,
            stats.comm.bucket_bytes.size(), stats.comm.emulated ? " [emulated link]" : "");
      else if (config.train.verbose)
        say("  lr %.2e | grad norm %.4g\n", stats.lr, stats.grad_norm);
      interval_ms = 0;
      interval_steps = 0;
    }
    if (config.train.eval_every > 0 && step % config.train.eval_every == 0 && step != total_steps)
      evaluate(step);
    if (config.train.checkpoint_every > 0 && step % config.train.checkpoint_every == 0 &&
        step != total_steps) {
      last_checkpoint = checkpoint_path(config, step);
      trainer.save_checkpoint(last_checkpoint);
      interrupt.update(step, last_checkpoint, resume_hint);
    }
    if (const int signo = agreed_interrupt(comm); signo != 0 && step != total_steps) {
      if (last_checkpoint != checkpoint_path(config, step)) {
        last_checkpoint = checkpoint_path(config, step);
        trainer.save_checkpoint(last_checkpoint);
      }
      if (is_root)
        say("interrupted by %s after step %d of %d: saved checkpoint %s\nresume with: %s\n",
            signo == SIGINT ? "SIGINT" : "SIGTERM", step, total_steps, last_checkpoint.c_str(),
            resume_hint.c_str());
      return 128 + signo;
    }
  }
  evaluate(trainer.step());
  last_checkpoint = checkpoint_path(config, trainer.step());
  trainer.save_checkpoint(last_checkpoint);

  if (is_root) {
    const int steps_run = trainer.step() - first_step;
    const double ms_per_step = steps_run > 0 ? train_ms / steps_run : 0.0;
    const std::string skipped_text =
        trainer.skipped_steps() > 0
            ? std::to_string(trainer.skipped_steps()) + " steps skipped (train.nan_policy) | "
            : "";
    const std::string resumed_text =
        first_step > 0 ? " (this process; resumed at step " + std::to_string(first_step) + ")" : "";
    say("done: %d steps%s in %.1fs | %.1f ms/step | %s %s/s | final loss %.4f | %scheckpoint "
        "%s%s\n",
        steps_run, resumed_text.c_str(), train_ms / 1e3, ms_per_step,
        human_rate(steps_run > 0 ? items_per_step / (ms_per_step / 1e3) : 0).c_str(),
        trainer.task().item_unit(), last_loss, skipped_text.c_str(), last_checkpoint.c_str(),
        emulated_link ? " [emulated link]" : "");
    if (profiler) {
      AdviceOptions advice_options;
      advice_options.dispatch_ms = measure_dispatch_ms();
      const std::vector<FusionAdvice> advice = advise_fusion(
          trainer.executor().graph(), profiler->profile(), config.fusion, advice_options);
      say("%s%s", format_profile(profiler->profile()).c_str(),
          format_advice(advice, advice_options).c_str());
      {
        nlohmann::json row = profile_json(profiler->profile());
        row["type"] = "profile";
        row["advice"] = advice_json(advice, advice_options);
        emit(row);
      }
    }
    {
      nlohmann::json summary = {{"type", "summary"},
                                {"steps", steps_run},
                                {"ms_per_step", ms_per_step},
                                {"final_loss", last_loss},
                                {"items_per_step", items_per_step},
                                {"world_size", world_size},
                                {"skipped_steps", trainer.skipped_steps()},
                                {"checkpoint", last_checkpoint}};
      if (emulated_link) summary["link"] = "emulated link";
      if (world_size > 1 && steps_run > 0)
        summary["comm_per_step"] = {
            {"comm_ms", comm_totals.comm_ms / steps_run},
            {"exposed_comm_ms", comm_totals.exposed_ms / steps_run},
            {"allreduce_calls", static_cast<double>(comm_totals.allreduce_calls) / steps_run},
            {"bytes_reduced", static_cast<double>(comm_totals.bytes_reduced) / steps_run},
            {"buckets", comm_totals.bucket_bytes.size()},
            {"bucket_bytes", comm_totals.bucket_bytes},
            {"extra_memory_bytes", comm_totals.extra_memory_bytes}};
      if (evaluated) summary["eval"] = eval_json(last_eval, trainer.step());
      if (first_step > 0) summary["resumed_at_step"] = first_step;
      emit(summary);
      metrics.close();
      if (json.is_open()) json.close();
    }
  }
  return 0;
}

}  // namespace ft
