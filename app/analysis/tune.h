// What `fusiontrain tune` decides, apart from measuring: the budget split, the value lists of the
// sweeps, the overrides of a candidate, and the report (text and JSON). app/jobs/tune_job.cpp runs
// the stages with app/training/bench_runner.h:
//   1. profile the unfused step (fusion.enabled=false) and take the passes advise_fusion names;
//   2. turn those passes on one at a time over the kept ones, each measured interleaved against
//      the current best and kept only when faster beyond noise twice (tune_keeps_change: the
//      p10-p90 of per-round speedups above 1.0 in the first measurement and again in a second,
//      independent interleaved block), so one lucky block cannot pick a change;
//   2b. measure the input config's own fusion switches (fusion.enabled and every pass key, as
//      the config and --set give them) against the current best, kept when faster beyond noise
//      twice
//      (skipped when the config is unfused or the kept passes already are its own), since the
//      advice can name nothing while the config's passes together are faster;
//   3. grow fusion.max_ops over 2, 3, 4, 6, 8 while the next value is faster beyond noise
//      (twice, as above), from
//      the smallest value that keeps every fusion the kept passes made at the config's own cap
//      (attention absorbs 3 ops, so with it kept the sweep starts at 3; skipped when no pass was
//      kept);
//   3b. fusion.tile_kb at a quarter and at four times its value (tune_tile_kb_values), each
//      against the current best and kept as a pass is; the first kept ends the stage (skipped
//      when no pass was kept);
//   4. (more than one rank only) comm.bucket_mb over 0.25..64 MB: every other power of two, then
//      the neighbours of the fastest; then comm.first_bucket_mb the same way, over the values at
//      or below the chosen comm.bucket_mb (config validation wants first <= bucket).
// Every training step of every measurement counts against --budget-steps; a stage that no
// longer fits is skipped and the report says so (a change whose second measurement no longer
// fits is not kept). The machine's load around the whole run is judged as bench does
// (app/analysis/machine_load.h): a warning line above the table and "machine_load" in the JSON.
// Thread safety: pure functions.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "app/analysis/machine_load.h"
#include "fusion/pass_registry.h"

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
// The fusion.tile_kb values the row-tile stage tries against `current`: a quarter and four times
// it, within the key's range [4, 65536] and never `current` itself (1024: 256 and 4096).
std::vector<int> tune_tile_kb_values(int current);
// The smallest of tune_max_ops_values() at which the config with `overrides` fuses its training
// graph into no more ops than at its own fusion.max_ops (the cap stage 2 measured at); the last
// value when none does. Builds the graphs (app/jobs/tune_job.cpp), unlike the functions around it.
int smallest_max_ops_keeping_fusions(const std::string& config_path,
                                     const std::vector<std::string>& overrides);

// fusion.enabled=true with every pass key of bench_ablation_keys(passes) off except `on`.
std::vector<std::string> tune_fusion_overrides(
    const std::vector<std::string>& on, const PassRegistry& passes = PassRegistry::standard());

// One interleaved measurement of a candidate against the current best: per-round step times,
// equally many (at least 1) of each.
struct TuneMeasurement {
  std::vector<double> baseline_ms, candidate_ms;
};
// The p10 of the per-round speedups (baseline ms / candidate ms) lies above 1.0, so the whole
// p10-p90 interval does. REQUIRES: baseline_ms.size() == candidate_ms.size() >= 1.
bool tune_faster_beyond_noise(const TuneMeasurement& measurement);
// Keep a change only when `first` and `second` (an independent block, measured after `first`
// said faster) are both faster beyond noise; without a second measurement (budget spent), no.
bool tune_keeps_change(const TuneMeasurement& first, const std::optional<TuneMeasurement>& second);

// Overrides with every key once: its last value, at the place of its first appearance (later
// overrides win in load_config, so the config is the same).
std::vector<std::string> tune_unique_overrides(const std::vector<std::string>& overrides);

// One measured point.
struct TunePoint {
  // "profile", "passes", "input", "max_ops", "tile_kb", "bucket_mb", "first_bucket_mb"; a second
  // measurement (`confirmation`) has its stage's name + " again", e.g. "passes again".
  std::string stage;
  std::string name;
  std::vector<std::string> overrides;  // on top of the config and its --set
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  std::string against;  // the point its speedup is over; empty for the stage-1 profile
  double speedup = 1, speedup_p10 = 1, speedup_p90 = 1;
  bool within_noise = false;
  bool kept = false;          // became the current best
  bool confirmation = false;  // the second measurement of a change the first found faster
};

struct TuneReport {
  std::string config_path;
  int world_size = 1;
  int budget_steps = 0;
  int steps_used = 0;
  std::vector<std::string> recommended_keys;  // stage 1's advice
  std::vector<TunePoint> points;
  std::vector<std::string> notes;             // skipped stages, budget stops
  std::vector<std::string> winner_overrides;  // the winner line names each key once
  double winner_median_ms = 0;
  std::string yaml_path;
  MachineLoad machine_load;
};

std::string format_tune_report(const TuneReport& report);
nlohmann::json tune_json(const TuneReport& report);

}  // namespace ft
