// What rank 0 of `train` writes about a run as it goes: progress lines to stdout and
// <run_dir>/log.txt, and JSON rows (steps, evals, profile, summary) to <run_dir>/metrics.jsonl
// and, with --json, to that file too. Every line and row is flushed as written, so a run that is
// killed keeps each finished step's row whole.
// Thread safety: the training thread only.
#pragma once
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/training/run_layout.h"
#include "app/training/task.h"
#include "app/training/trainer.h"

namespace ft {

class RunOutput {
 public:
  // Opens log.txt and metrics.jsonl in `run_dir` (appended to when `append`: a resume adds to
  // the run's history) and `json_path` when not empty. Throws ft::Error naming a file it cannot
  // open.
  void open(const std::string& run_dir, const std::string& json_path, bool append);
  bool is_open() const { return log_ != nullptr; }
  // A progress line; on stdout only until open().
  void say(const char* format, ...) __attribute__((format(printf, 2, 3)));
  void emit(const nlohmann::json& row);
  void step(const StepStats& stats, int64_t items);
  void eval(const EvalResult& result, int step);
  // For the interrupt handler's message; -1 before open().
  int log_fd() const { return log_ ? fileno(log_.get()) : -1; }
  // Flushes and closes the JSON files (the log closes with the object).
  void close();

 private:
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> log_{nullptr, &std::fclose};
  JsonLinesFile metrics_, json_;
};

nlohmann::json eval_json(const EvalResult& result, int step);

// What the summary line and row report, summed over this process's steps.
struct RunTotals {
  int first_step = 0;  // the step the process started at (> 0 after a resume)
  int steps = 0;
  double train_ms = 0.0;
  float last_loss = 0.0f;
  bool emulated_link = false;
  CommStepStats comm;  // summed, except the bucket layout and memory (the last step's)
  void add(const StepStats& stats);
};

// The summary row: steps, ms per step, final loss, communication per step (world_size > 1), the
// last evaluation (when `eval` is not null) and the checkpoint.
nlohmann::json summary_json(const RunTotals& totals, int64_t items_per_step, int world_size,
                            int skipped_steps, const std::string& checkpoint,
                            const nlohmann::json* eval);

}  // namespace ft
