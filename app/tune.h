// What `fusiontrain tune` decides, apart from measuring: the budget split, the value lists of the
// sweeps, the overrides of a candidate, and the report (text and JSON). app/tune_job.cpp runs the
// stages with app/bench_runner.h:
//   1. profile the unfused step (fusion.enabled=false) and take the passes advise_fusion names;
//   2. turn those passes on one at a time over the kept ones, each measured interleaved against
//      the current best and kept only when the speedup's p10 lies above 1.0 (beyond noise);
//   2b. measure the input config's own fusion switches (fusion.enabled and every pass key, as
//      the config and --set give them) against the current best, kept when faster beyond noise
//      (skipped when the config is unfused or the kept passes already are its own), since the
//      advice can name nothing while the config's passes together are faster;
//   3. grow fusion.max_ops over 2, 3, 4, 6, 8 while the next value is faster beyond noise, from
//      the smallest value that keeps every fusion the kept passes made at the config's own cap
//      (attention absorbs 3 ops, so with it kept the sweep starts at 3; skipped when no pass was
//      kept);
//   4. (more than one rank only) comm.bucket_mb over 0.25..64 MB: every other power of two, then
//      the neighbours of the fastest; then comm.first_bucket_mb the same way, over the values at
//      or below the chosen comm.bucket_mb (config validation wants first <= bucket).
// Every training step of every measurement counts against --budget-steps; a stage that no
// longer fits is skipped and the report says so.
// Thread safety: pure functions.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ft {

// Steps per variant of one measurement.
struct TuneMeasureSize {
  int warmup = 1;
  int rounds = 3;
  int steps_per_variant() const { return warmup + rounds; }
};
// Splits `steps_left` among `variant_runs` planned variant measurements: at least 1 warm-up and
// 3 timed rounds each (fewer runs then fit), about a fifth warm-up.
TuneMeasureSize plan_tune_measure(int steps_left, int variant_runs);

// 0.25, 0.5, ..., 64 MB; the coarse pass takes every other one (0.25, 1, 4, 16, 64); the fine
// pass the values next to `best` that exist in the full list.
std::vector<double> tune_bucket_values();
std::vector<double> tune_coarse_bucket_values();
std::vector<double> tune_fine_bucket_values(double best);
// 2, 3, 4, 6, 8.
std::vector<int> tune_max_ops_values();
// The smallest of tune_max_ops_values() at which the config with `overrides` fuses its training
// graph into no more ops than at its own fusion.max_ops (the cap stage 2 measured at); the last
// value when none does. Builds the graphs (app/tune_job.cpp), unlike the functions around it.
int smallest_max_ops_keeping_fusions(const std::string& config_path,
                                     const std::vector<std::string>& overrides);

// fusion.enabled=true with every pass key of bench_ablation_keys() off except `on`.
std::vector<std::string> tune_fusion_overrides(const std::vector<std::string>& on);

// One measured point.
struct TunePoint {
  std::string stage;  // "profile", "passes", "input", "max_ops", "bucket_mb", "first_bucket_mb"
  std::string name;
  std::vector<std::string> overrides;  // on top of the config and its --set
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  std::string against;  // the point its speedup is over; empty for the stage-1 profile
  double speedup = 1, speedup_p10 = 1, speedup_p90 = 1;
  bool within_noise = false;
  bool kept = false;  // became the current best
};

struct TuneReport {
  std::string config_path;
  int world_size = 1;
  int budget_steps = 0;
  int steps_used = 0;
  std::vector<std::string> recommended_keys;  // stage 1's advice
  std::vector<TunePoint> points;
  std::vector<std::string> notes;  // skipped stages, budget stops
  std::vector<std::string> winner_overrides;
  double winner_median_ms = 0;
  std::string yaml_path;
};

std::string format_tune_report(const TuneReport& report);
nlohmann::json tune_json(const TuneReport& report);

}  // namespace ft
