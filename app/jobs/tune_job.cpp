// `fusiontrain tune`: the stages of app/analysis/tune.h, each measurement a bench run
// (app/training/bench_runner.h) of the current best against its candidates, interleaved, from the
// same parameters and batches. Under mpirun every rank runs the same stages; decisions use rank 0's
// times, which run_bench_variants shares with every rank, so the ranks stay in step.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>

#include "app/analysis/bench.h"
#include "app/analysis/machine_load.h"
#include "app/analysis/tune.h"
#include "app/cli/flag_checks.h"
#include "app/jobs/jobs.h"
#include "app/training/bench_runner.h"
#include "app/training/task.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "fusion/pipeline.h"

namespace ft {
namespace {

std::string mb_text(double mb) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", mb);
  return text;
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// Median step time of result `v` of `run`.
double median_of(const BenchRun& run, size_t v) {
  return bench_percentile(run.results[v].step_ms, 0.5);
}

class Tuner {
 public:
  Tuner(const TuneArgs& args, Communicator* comm) : args_(args), comm_(comm) {
    report_.config_path = args.config_path;
    report_.world_size = comm ? comm->size() : 1;
    report_.budget_steps = args.budget_steps;
    is_root_ = comm == nullptr || comm->rank() == 0;
  }

  TuneReport& report() { return report_; }
  bool is_root() const { return is_root_; }

  // Measures `candidates` (name, overrides on top of the config), the first being the baseline.
  // Returns false, with a note, when the budget cannot pay for it.
  bool measure(const char* stage, const std::vector<BenchVariant>& candidates, TuneMeasureSize size,
               BenchRun* run) {
    const int cost = static_cast<int>(candidates.size()) * size.steps_per_variant();
    if (report_.steps_used + cost > args_.budget_steps) {
      report_.notes.push_back(std::string("budget spent: ") + stage + " stopped (" +
                              std::to_string(report_.steps_used) + " of " +
                              std::to_string(args_.budget_steps) +
                              " steps used, the next "
                              "measurement needs " +
                              std::to_string(cost) + ")");
      return false;
    }
    std::vector<Config> configs;
    for (const BenchVariant& candidate : candidates)
      configs.push_back(load_config(args_.config_path, with(args_.overrides, candidate.overrides)));
    BenchRunOptions options;
    options.warmup = size.warmup;
    options.rounds = size.rounds;
    options.label = "tune";
    if (is_root_) {
      std::fprintf(stderr, "tune: %s: %zu point(s) x (%d warmup + %d rounds)\n", stage,
                   candidates.size(), size.warmup, size.rounds);
      std::fflush(stderr);
    }
    *run = run_bench_variants(configs, candidates, options, comm_);
    report_.steps_used += run->steps_executed;
    return true;
  }

  // What try_change found: whether the first measurement ran, whether the budget stopped one
  // of the two (then the change is not kept), and whether the change is kept.
  struct Change {
    bool measured = false;
    bool spent = false;
    bool keep = false;
  };

  // Measures `candidate` against `best` and, when it is faster beyond noise, again in a second
  // interleaved block (in the other order); keeps it only when both say so (tune_keeps_change).
  // Records both measurements and sets *best_ms to the latest measurement of the best.
  Change try_change(const char* stage, const BenchVariant& best, const BenchVariant& candidate,
                    TuneMeasureSize size, double* best_ms) {
    Change change;
    BenchRun run;
    if (!measure(stage, {best, candidate}, size, &run)) {
      change.spent = true;
      return change;
    }
    change.measured = true;
    const TuneMeasurement first{run.results[0].step_ms, run.results[1].step_ms};
    std::optional<TuneMeasurement> second;
    BenchRun again;
    const std::string again_stage = std::string(stage) + " again";
    if (tune_faster_beyond_noise(first)) {
      change.spent = !measure(again_stage.c_str(), {candidate, best}, size, &again);
      if (!change.spent)
        second = TuneMeasurement{again.results[1].step_ms, again.results[0].step_ms};
    }
    change.keep = tune_keeps_change(first, second);
    record(stage, run, 0, change.keep ? 1 : 0);
    if (second) record(again_stage.c_str(), again, 1, change.keep ? 0 : 1, true);
    *best_ms = second ? median_of(again, change.keep ? 0 : 1) : median_of(run, change.keep ? 1 : 0);
    return change;
  }

  // Records every point of `run` with its speedup over point `against` (index into run).
  void record(const char* stage, const BenchRun& run, size_t against, size_t kept,
              bool confirmation = false) {
    std::vector<BenchVariantResult> ordered = {run.results[against]};
    for (size_t v = 0; v < run.results.size(); ++v)
      if (v != against) ordered.push_back(run.results[v]);
    const std::vector<BenchSummary> summaries = summarize_bench(ordered);
    for (size_t i = 0; i < ordered.size(); ++i) {
      const BenchSummary& s = summaries[i];
      TunePoint point;
      point.stage = stage;
      point.name = s.name;
      point.overrides = ordered[i].variant.overrides;
      point.median_ms = s.median_ms;
      point.p10_ms = s.p10_ms;
      point.p90_ms = s.p90_ms;
      if (i > 0) point.against = ordered[0].variant.name;
      point.speedup = s.speedup;
      point.speedup_p10 = s.speedup_low;
      point.speedup_p90 = s.speedup_high;
      point.within_noise = s.within_noise;
      point.kept = ordered[i].variant.name == run.results[kept].variant.name;
      point.confirmation = confirmation;
      report_.points.push_back(point);
    }
  }

 private:
  const TuneArgs& args_;
  Communicator* comm_;
  TuneReport report_;
  bool is_root_ = true;
};

// The config's own fusion switches (fusion.enabled and every pass key) as overrides, so the
// report and the YAML say exactly what the "input" point ran.
std::vector<std::string> own_fusion_overrides(const Config& config) {
  std::vector<std::string> keys = bench_ablation_keys();
  keys.insert(keys.begin(), "fusion.enabled");
  std::vector<std::string> overrides;
  for (const auto& [key, value] : flatten_config(config))
    if (contains(keys, key)) overrides.push_back(key + "=" + value);
  return overrides;
}

}  // namespace

int smallest_max_ops_keeping_fusions(const std::string& config_path,
                                     const std::vector<std::string>& overrides) {
  // Op count of the fused training graph with `overrides` and, when given, fusion.max_ops.
  auto fused_ops = [&](int max_ops) {
    const Config config = load_config(
        config_path,
        max_ops > 0 ? with(overrides, {"fusion.max_ops=" + std::to_string(max_ops)}) : overrides);
    std::unique_ptr<Task> task = make_task(config, 0, 1);
    ParamStore params;
    task->register_params(params);
    params.allocate();
    Graph graph = task->build_graph(config.train.batch_size, GraphMode::kTrain);
    FusionPipeline::standard().run(graph, params, config.fusion);
    return graph.ops.size();
  };
  const size_t measured = fused_ops(0);
  for (int max_ops : tune_max_ops_values())
    if (fused_ops(max_ops) <= measured) return max_ops;
  return tune_max_ops_values().back();
}

int run_tune(const TuneArgs& args, Communicator* comm) {
  // The winner would replace the input, and with it the comments and keys it did not set.
  FT_USAGE_REQUIRE(args.out_path.empty() || !same_file(args.config_path, args.out_path), "--out '",
                   args.out_path,
                   "' is the --config tune reads; writing the winner there would replace "
                   "it: choose another --out (default runs/tuned.yaml)");
  const Config base = load_config(args.config_path, args.overrides);
  omp_set_num_threads(resolve_threads(base.train.threads));
  const MachineLoadWatch machine_load;
  Tuner tuner(args, comm);
  TuneReport& report = tuner.report();
  const int world_size = comm ? comm->size() : 1;

  // 1. Profile the unfused step; a tenth of the budget, at least 1 + 3 steps.
  BenchVariant best{"unfused", {"fusion.enabled=false"}};
  std::vector<std::string> kept_keys;
  BenchRun run;
  const TuneMeasureSize profile_size = plan_tune_measure(args.budget_steps / 10, 1);
  if (!tuner.measure("profile", {best}, profile_size, &run))
    FT_USAGE_FAIL("--budget-steps ", args.budget_steps,
                  " cannot pay for the first measurement (the ", "unfused profile needs ",
                  profile_size.steps_per_variant(), " steps); give tune at least that many");
  tuner.record("profile", run, 0, 0);
  double best_ms = median_of(run, 0);
  if (tuner.is_root()) std::printf("%s", format_top_ops("unfused", run.profiles[0], 5).c_str());
  // Advice lives on rank 0; every rank tries every pass key in the same order so that the ranks
  // stay in step, but only rank 0's advice filters them (broadcast as a mask).
  std::vector<float> recommended(bench_ablation_keys().size(), 0.0f);
  if (tuner.is_root())
    for (const FusionAdvice& advice : run.advice[0])
      for (size_t k = 0; k < recommended.size(); ++k)
        if (advice.pass_key == bench_ablation_keys()[k]) recommended[k] = 1.0f;
  if (comm != nullptr && comm->size() > 1)
    comm->broadcast(recommended.data(), recommended.size(), 0);
  for (size_t k = 0; k < recommended.size(); ++k)
    if (recommended[k] > 0.5f) report.recommended_keys.push_back(bench_ablation_keys()[k]);

  // Plan the rest: a change is 2 points, and 2 more when it is faster beyond noise and measured
  // again (try_change), so 4 per pass, 4 for the input's own fusion, up to 4 changes of max_ops,
  // 4 per tile_kb value; 2 x (5 + 3) bucket points.
  const bool sweep_buckets = world_size > 1 && base.comm.bucketing;
  const int planned =
      4 * static_cast<int>(report.recommended_keys.size()) + 4 + 16 + 8 + (sweep_buckets ? 16 : 0);
  const TuneMeasureSize size =
      plan_tune_measure(args.budget_steps - report.steps_used, std::max(1, planned));

  // 2. One pass at a time over the kept ones.
  bool spent = false;
  for (const std::string& key : report.recommended_keys) {
    BenchVariant candidate{"+" + key.substr(key.rfind('.') + 1),
                           tune_fusion_overrides(with(kept_keys, {key}))};
    const auto change = tuner.try_change("passes", best, candidate, size, &best_ms);
    spent = change.spent;
    if (spent) break;
    if (!change.keep) continue;
    kept_keys.push_back(key);
    best = candidate;
  }

  // 2b. The input config's own fusion settings against the best so far: the advice sees large
  // intermediates, not time saved, so it can name nothing (or too little) while the config's
  // passes together are faster. Every rank decides alike (rank 0's times, shared).
  const BenchVariant input{"input", own_fusion_overrides(base)};
  if (spent) {
  } else if (!base.fusion.enabled) {
    report.notes.push_back(
        "input: skipped, the config's fusion.enabled is false (the profile measured it)");
  } else if (flatten_config(load_config(args.config_path, with(args.overrides, input.overrides))) ==
             flatten_config(load_config(args.config_path, with(args.overrides, best.overrides)))) {
    report.notes.push_back("input: skipped, the kept passes are the config's own");
  } else {
    const auto change = tuner.try_change("input", best, input, size, &best_ms);
    spent = change.spent;
    if (change.keep) {
      best = input;
      kept_keys.clear();  // the passes the input has on, for the max_ops stage
      for (const std::string& key : bench_ablation_keys())
        if (contains(input.overrides, key + "=true")) kept_keys.push_back(key);
    }
  }

  // 3. Grow max_ops.
  if (spent) {
  } else if (kept_keys.empty()) {
    report.notes.push_back("max_ops: skipped, no fusion pass was kept");
  } else {
    // Below `start` a fusion the passes stage kept would no longer fit in one op.
    const int start =
        smallest_max_ops_keeping_fusions(args.config_path, with(args.overrides, best.overrides));
    // From the best of the stages before, not the latest capped one (whose max_ops it replaces).
    const BenchVariant uncapped = best;
    auto capped = [&](int max_ops) {
      return BenchVariant{uncapped.name + ",max_ops=" + std::to_string(max_ops),
                          with(uncapped.overrides, {"fusion.max_ops=" + std::to_string(max_ops)})};
    };
    BenchVariant current = capped(start);
    for (int max_ops : tune_max_ops_values()) {
      if (max_ops <= start) continue;
      const BenchVariant candidate = capped(max_ops);
      const auto change = tuner.try_change("max_ops", current, candidate, size, &best_ms);
      spent = change.spent;
      // The first pair also measures `start`, which stands when the next value is no faster
      // (after that, `current` is already the best).
      if (change.measured) best = change.keep ? candidate : current;
      if (!change.keep) break;
      current = candidate;
    }
  }

  // 3b. Row tiles: fusion.tile_kb's default was measured on one CPU (docs/mixed_precision.md,
  // "Row tiles"), and a CPU with another L2 or precision may want other tiles. A quarter and four
  // times the current value, each against the best so far, kept the way a pass is.
  if (spent) {
  } else if (kept_keys.empty()) {
    report.notes.push_back("tile_kb: skipped, no fusion pass was kept");
  } else {
    const int current =
        load_config(args.config_path, with(args.overrides, best.overrides)).fusion.tile_kb;
    const BenchVariant untiled = best;
    for (int tile_kb : tune_tile_kb_values(current)) {
      const std::string setting = "tile_kb=" + std::to_string(tile_kb);
      const BenchVariant candidate{untiled.name + "," + setting,
                                   with(untiled.overrides, {"fusion." + setting})};
      const auto change = tuner.try_change("tile_kb", best, candidate, size, &best_ms);
      spent = change.spent;
      if (spent) break;
      if (change.keep) {
        best = candidate;
        break;
      }
    }
  }

  // 4. Bucket sizes.
  if (!sweep_buckets) {
    report.notes.push_back(
        world_size == 1
            ? "comm.bucket_mb, comm.first_bucket_mb: skipped, 1 rank has no communication for "
              "bucket sizes to change (run under mpirun -np N to sweep them)"
            : "comm.bucket_mb, comm.first_bucket_mb: skipped, comm.bucketing is false");
  } else {
    // The first bucket may not exceed the others (config validation): the bucket_mb sweep caps
    // it at each value, and the first_bucket_mb sweep stays at or below the chosen bucket_mb.
    double bucket_mb = base.comm.bucket_mb;
    const double first_bucket_mb = base.comm.first_bucket_mb;
    for (const char* key : {"comm.bucket_mb", "comm.first_bucket_mb"}) {
      if (spent) break;
      const bool first = std::string(key) == "comm.first_bucket_mb";
      const std::string stage = std::string(key).substr(5);
      double winner = 0;
      const BenchVariant stage_base = best;
      for (int pass = 0; pass < 2 && !spent; ++pass) {
        std::vector<double> values;
        for (double mb : pass == 0 ? tune_coarse_bucket_values() : tune_fine_bucket_values(winner))
          if (!first || mb <= bucket_mb) values.push_back(mb);
        if (pass == 1) values.insert(values.begin(), winner);
        if (values.size() < 2) {
          if (pass == 0)
            report.notes.push_back(stage + ": skipped, only " + mb_text(bucket_mb) +
                                   " MB fits under comm.bucket_mb");
          break;
        }
        std::vector<BenchVariant> candidates;
        for (double mb : values) {
          std::vector<std::string> overrides = {std::string(key) + "=" + mb_text(mb)};
          if (!first)
            overrides.push_back("comm.first_bucket_mb=" + mb_text(std::min(mb, first_bucket_mb)));
          candidates.push_back({stage_base.name + "," + stage + "=" + mb_text(mb),
                                with(stage_base.overrides, overrides)});
        }
        if (!tuner.measure(stage.c_str(), candidates, size, &run)) {
          spent = true;
          break;
        }
        size_t fastest = 0;
        for (size_t v = 1; v < values.size(); ++v)
          if (median_of(run, v) < median_of(run, fastest)) fastest = v;
        tuner.record(stage.c_str(), run, fastest, fastest);
        winner = values[fastest];
        best = candidates[fastest];
        best_ms = median_of(run, fastest);
        if (!first) bucket_mb = winner;
      }
    }
  }

  report.winner_overrides = tune_unique_overrides(best.overrides);
  report.machine_load = machine_load.finish();
  report.winner_median_ms = best_ms;
  report.yaml_path = args.out_path;
  if (tuner.is_root()) {
    const Config chosen = load_config(args.config_path, with(args.overrides, best.overrides));
    write_file_atomic(args.out_path,
                      "# fusiontrain tune: " + best.name + "\n" + config_to_yaml(chosen));
    std::printf("\ntune: %s, %d rank(s)\n\n%s", args.config_path.c_str(), world_size,
                format_tune_report(report).c_str());
    std::fflush(stdout);
    if (!args.json_path.empty()) {
      write_output_file(args.json_path, tune_json(report).dump(2) + "\n");
    }
  }
  return 0;
}

}  // namespace ft
