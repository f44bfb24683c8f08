// RunOutput: rank 0's progress lines and JSON rows (see run_output.h).
#include "app/training/run_output.h"

#include <cstdarg>
#include <filesystem>

#include "core/check.h"

namespace ft {
namespace {

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

}  // namespace

nlohmann::json eval_json(const EvalResult& result, int step) {
  nlohmann::json row = {
      {"type", "eval"}, {"step", step}, {"loss", result.loss}, {"examples", result.examples}};
  if (result.accuracy >= 0) row["accuracy"] = result.accuracy;
  if (result.bits_per_byte >= 0) row["bits_per_byte"] = result.bits_per_byte;
  return row;
}

void RunOutput::open(const std::string& run_dir, const std::string& json_path, bool append) {
  const std::filesystem::path dir(run_dir);
  metrics_.open((dir / "metrics.jsonl").string(), append);
  if (!json_path.empty()) json_.open(json_path);
  const std::string log_path = (dir / "log.txt").string();
  log_.reset(std::fopen(log_path.c_str(), "a"));
  FT_REQUIRE(log_ != nullptr, "cannot open '", log_path, "' for writing");
}

void RunOutput::say(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::fflush(stdout);
  if (log_ == nullptr) return;
  va_start(args, format);
  std::vfprintf(log_.get(), format, args);
  va_end(args);
  std::fflush(log_.get());
}

void RunOutput::emit(const nlohmann::json& row) {
  if (metrics_.is_open()) metrics_.write(row, true);
  if (json_.is_open()) json_.write(row, true);
}

void RunOutput::step(const StepStats& stats, int64_t items) {
  emit(step_json(stats, items));
}

void RunOutput::eval(const EvalResult& result, int step) {
  if (result.accuracy >= 0)
    say("eval  step %d | test loss %.4f | test accuracy %.2f%% (%lld images)\n", step, result.loss,
        100.0 * result.accuracy, static_cast<long long>(result.examples));
  else
    say("eval  step %d | val loss %.4f | %.4f bits/byte (%lld windows)\n", step, result.loss,
        result.bits_per_byte, static_cast<long long>(result.examples));
  emit(eval_json(result, step));
}

void RunTotals::add(const StepStats& stats) {
  ++steps;
  train_ms += stats.step_ms;
  last_loss = stats.loss;
  emulated_link = emulated_link || stats.comm.emulated;
  comm.comm_ms += stats.comm.comm_ms;
  comm.exposed_ms += stats.comm.exposed_ms;
  comm.allreduce_calls += stats.comm.allreduce_calls;
  comm.bytes_reduced += stats.comm.bytes_reduced;
  comm.bucket_bytes = stats.comm.bucket_bytes;
  comm.extra_memory_bytes = stats.comm.extra_memory_bytes;
}

nlohmann::json summary_json(const RunTotals& totals, int64_t items_per_step, int world_size,
                            int skipped_steps, const std::string& checkpoint,
                            const nlohmann::json* eval) {
  const int steps = totals.steps;
  nlohmann::json summary = {{"type", "summary"},
                            {"steps", steps},
                            {"ms_per_step", steps > 0 ? totals.train_ms / steps : 0.0},
                            {"final_loss", totals.last_loss},
                            {"items_per_step", items_per_step},
                            {"world_size", world_size},
                            {"skipped_steps", skipped_steps},
                            {"checkpoint", checkpoint}};
  if (totals.emulated_link) summary["link"] = "emulated link";
  const CommStepStats& comm = totals.comm;
  if (world_size > 1 && steps > 0)
    summary["comm_per_step"] = {
        {"comm_ms", comm.comm_ms / steps},
        {"exposed_comm_ms", comm.exposed_ms / steps},
        {"allreduce_calls", static_cast<double>(comm.allreduce_calls) / steps},
        {"bytes_reduced", static_cast<double>(comm.bytes_reduced) / steps},
        {"buckets", comm.bucket_bytes.size()},
        {"bucket_bytes", comm.bucket_bytes},
        {"extra_memory_bytes", comm.extra_memory_bytes}};
  if (eval != nullptr) summary["eval"] = *eval;
  if (totals.first_step > 0) summary["resumed_at_step"] = totals.first_step;
  return summary;
}

void RunOutput::close() {
  if (metrics_.is_open()) metrics_.close();
  if (json_.is_open()) json_.close();
}

}  // namespace ft
