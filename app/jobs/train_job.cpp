// `fusiontrain train`: the training loop. Where its concerns live: the config and resume
// (resume.h), the run folder and interrupts (run_layout.h), progress lines and JSON rows
// (run_output.h), the step, evaluation and checkpoints (trainer.h), profile and trace.
#include <omp.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/analysis/fusion_advice.h"
#include "app/analysis/profiler.h"
#include "app/analysis/throughput.h"
#include "app/jobs/jobs.h"
#include "app/training/device_setup.h"
#include "app/training/resume.h"
#include "app/training/run_layout.h"
#include "app/training/run_output.h"
#include "app/training/trace.h"
#include "app/training/trainer.h"
#include "comm/startup.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/timer.h"

namespace ft {
namespace {

// The signal that asked the run to stop on any rank (SIGINT when ranks got different ones), or
// 0. Collective: every rank stops after the same step.
int agreed_interrupt(Communicator* comm) {
  const int local = InterruptHandlers::requested();
  if (comm == nullptr) return local;
  float votes[2] = {local == SIGINT ? 1.0f : 0.0f, local == SIGTERM ? 1.0f : 0.0f};
  comm->allreduce(votes, 2, ReduceOp::kSum);
  return votes[0] > 0 ? SIGINT : votes[1] > 0 ? SIGTERM : 0;
}

// The start: model, parameters, items per step, ranks and threads, settings, where it writes.
void say_start(RunOutput& out, const Config& config, Trainer& trainer, int world_size,
               const std::string& config_name) {
  const int threads = omp_get_max_threads();
  out.say("%s: %s, %.2fM parameters, %lld %s per step (%lld per rank), %d rank%s x %d thread%s\n",
          config.source_path.c_str(), trainer.task().describe().c_str(),
          trainer.params().num_trainable_floats() / 1e6,
          static_cast<long long>(trainer.items_per_step()), trainer.task().item_unit(),
          static_cast<long long>(trainer.items_per_step() / world_size), world_size,
          world_size == 1 ? "" : "s", threads, threads == 1 ? "" : "s");
  out.say("settings:%s\nrun dir %s (%s, log.txt, metrics.jsonl), checkpoints in %s\n",
          non_default_settings(config).c_str(), config.train.run_dir.c_str(), config_name.c_str(),
          config.train.checkpoint_dir.c_str());
  // Once per run: whether bf16 pays on this CPU, so a slow bf16 run is never a mystery.
  if (config.train.precision == "bf16")
    out.say("precision bf16: GEMM operands in bf16, fp32 masters and reductions; %s\n",
            bf16_kernels_text(trainer.params().device()).c_str());
}

// A progress line (the interval's ms/step, the run's ETA) and, with train.verbose, the step's lr,
// gradient norm and (several ranks) communication.
void say_progress(RunOutput& out, const Config& config, Trainer& trainer, const StepStats& stats,
                  double interval_ms_per_step, const RunTotals& totals, double elapsed_s,
                  int world_size) {
  const int total_steps = config.train.steps;
  const double eta_s = totals.train_ms / totals.steps * (total_steps - stats.step) / 1e3;
  out.say("step %d/%d | loss %.4f | %.1f ms/step | %s %s/s | %s elapsed | ETA %s\n", stats.step,
          total_steps, stats.loss, interval_ms_per_step,
          human_rate(trainer.items_per_step() / (interval_ms_per_step / 1e3)).c_str(),
          trainer.task().item_unit(), clock_text(elapsed_s).c_str(), clock_text(eta_s).c_str());
  if (!config.train.verbose) return;
  if (world_size > 1)
    out.say(
        "  lr %.2e | grad norm %.4g | compute %.1f ms, comm %.1f ms, exposed %.1f ms, %lld "
        "allreduce, %.2f MB, %zu buckets%s\n",
        stats.lr, stats.grad_norm, stats.compute_ms, stats.comm.comm_ms, stats.comm.exposed_ms,
        static_cast<long long>(stats.comm.allreduce_calls), stats.comm.bytes_reduced / 1e6,
        stats.comm.bucket_bytes.size(), stats.comm.emulated ? " [emulated link]" : "");
  else
    out.say("  lr %.2e | grad norm %.4g\n", stats.lr, stats.grad_norm);
}

// The done line, the profile and its advice (train.profile), and the summary row.
void say_done(RunOutput& out, const Config& config, Trainer& trainer, const RunTotals& totals,
              const Profiler* profiler, const std::string& checkpoint, int world_size,
              const nlohmann::json* eval) {
  const double ms_per_step = totals.steps > 0 ? totals.train_ms / totals.steps : 0.0;
  const std::string skipped_text =
      trainer.skipped_steps() > 0
          ? std::to_string(trainer.skipped_steps()) + " steps skipped (train.nan_policy) | "
          : "";
  const std::string resumed_text =
      totals.first_step > 0
          ? " (this process; resumed at step " + std::to_string(totals.first_step) + ")"
          : "";
  out.say(
      "done: %d steps%s in %.1fs | %.1f ms/step | %s %s/s | final loss %.4f | %scheckpoint "
      "%s%s\n",
      totals.steps, resumed_text.c_str(), totals.train_ms / 1e3, ms_per_step,
      human_rate(totals.steps > 0 ? trainer.items_per_step() / (ms_per_step / 1e3) : 0).c_str(),
      trainer.task().item_unit(), totals.last_loss, skipped_text.c_str(), checkpoint.c_str(),
      totals.emulated_link ? " [emulated link]" : "");
  if (profiler != nullptr) {
    AdviceOptions advice_options;
    advice_options.dispatch_ms = measure_dispatch_ms();
    const std::vector<FusionAdvice> advice = advise_fusion(
        trainer.executor().graph(), profiler->profile(), config.fusion, advice_options);
    out.say("%s%s", format_profile(profiler->profile()).c_str(),
            format_advice(advice, advice_options).c_str());
    nlohmann::json row = profile_json(profiler->profile());
    row["type"] = "profile";
    row["advice"] = advice_json(advice, advice_options);
    out.emit(row);
  }
  out.emit(summary_json(totals, trainer.items_per_step(), world_size, trainer.skipped_steps(),
                        checkpoint, eval));
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
  refuse_to_overwrite(config, comm, is_root);

  // Before anything is written: loading train.resume checks the checkpoint.
  Trainer trainer(config, comm);
  if (trainer.step() >= config.train.steps) {
    if (is_root)
      std::printf("%s: already finished at step %d; nothing to do (raise train.steps to go on)\n",
                  config.train.resume.c_str(), trainer.step());
    return 0;
  }
  RunOutput out;
  if (is_root) {
    // A resume adds to the run's history: metrics.jsonl and log.txt are appended to, and when
    // the run dir already has a config.yaml (the run's start) this part's config goes beside it.
    const bool resumed = !config.train.resume.empty();
    const std::filesystem::path run_dir(config.train.run_dir);
    std::error_code error;
    const std::string config_name =
        resumed && std::filesystem::exists(run_dir / "config.yaml", error)
            ? "config.resume-" + std::to_string(trainer.step()) + ".yaml"
            : "config.yaml";
    write_file_atomic((run_dir / config_name).string(), config_to_yaml(config));
    if (loaded.train.run_dir.empty()) point_latest_at(config.train.run_dir);
    out.open(config.train.run_dir, args.json_path, resumed);
    say_start(out, config, trainer, world_size, config_name);
  }
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
  const int total_steps = config.train.steps;
  RunTotals totals;
  totals.first_step = trainer.step();
  nlohmann::json last_eval;
  const auto evaluate = [&](int step) {
    if (!is_root) return;
    const EvalResult result = trainer.evaluate(config.train.eval_batches);
    out.eval(result, step);
    last_eval = eval_json(result, step);
  };
  std::string last_checkpoint;
  // SIGINT/SIGTERM: the run stops after the step in progress, saves it and says how to resume.
  InterruptHandlers interrupt(is_root, out.log_fd());
  const std::string resume_hint = resume_command(args.program, config.train.run_dir, world_size);
  interrupt.update(totals.first_step, config.train.resume, resume_hint);
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
    totals.add(stats);
    const int step = stats.step;
    if (is_root) out.step(stats, trainer.items_per_step());
    interrupt.update(step, last_checkpoint.empty() ? config.train.resume : last_checkpoint,
                     resume_hint);
    if (is_root && stats.skipped)
      out.say(
          "step %d/%d | loss %g, gradient norm %g: update skipped (%d skipped so far, "
          "train.max_skipped_steps %d)\n",
          step, total_steps, stats.loss, stats.grad_norm, trainer.skipped_steps(),
          config.train.max_skipped_steps);
    interval_ms += stats.step_ms;
    ++interval_steps;
    const bool log_now = step == totals.first_step + 1 || step == total_steps ||
                         (config.train.log_every > 0 && step % config.train.log_every == 0);
    if (is_root && log_now) {
      say_progress(out, config, trainer, stats, interval_ms / interval_steps, totals,
                   (now_ms() - start_ms) / 1e3, world_size);
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
        out.say("interrupted by %s after step %d of %d: saved checkpoint %s\nresume with: %s\n",
                signo == SIGINT ? "SIGINT" : "SIGTERM", step, total_steps, last_checkpoint.c_str(),
                resume_hint.c_str());
      return 128 + signo;
    }
  }
  evaluate(trainer.step());
  last_checkpoint = checkpoint_path(config, trainer.step());
  trainer.save_checkpoint(last_checkpoint);
  if (is_root) {
    say_done(out, config, trainer, totals, profiler.get(), last_checkpoint, world_size,
             last_eval.is_null() ? nullptr : &last_eval);
    out.close();
  }
  return 0;
}

}  // namespace ft
