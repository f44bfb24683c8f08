// `fusiontrain simulate`: profiles a few training steps of the config on this machine (one rank,
// no communication), reads the model's real gradient buckets and the op whose backward makes each
// bucket's last gradient final, and hands both to app/analysis/simulate.h for each rank count.
// --validate, under mpirun with N ranks: the four bucketing × overlap modes train for real with
// comm.emulate set so that each allreduce costs what the ring model predicts at N ranks, in rounds
// with the profiling trainer (every rank profiles, so the ranks contend for the cores as they do
// in training), and rank 0 prints prediction against measurement.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "app/analysis/profiler.h"
#include "app/analysis/simulate.h"
#include "app/jobs/jobs.h"
#include "app/training/trainer.h"
#include "comm/buckets.h"
#include "core/atomic_file.h"
#include "core/check.h"

namespace ft {
namespace {

// A single-process Trainer (no communication) whose executor reports every op to a Profiler.
class ProfiledTrainer {
 public:
  ProfiledTrainer(const Config& config, int warmup)
      : trainer_(config, nullptr), profiler_(trainer_.executor().graph(), warmup) {
    trainer_.executor().set_observer(&profiler_);
  }
  ~ProfiledTrainer() { trainer_.executor().set_observer(nullptr); }

  void step() {
    profiler_.begin_step();
    const StepStats stats = trainer_.train_step();
    profiler_.end_step(stats.step_ms);
  }

  // The measured steps' means, divided by `compute_scale`.
  SimStep sim_step(double compute_scale) const {
    const Profile& profile = profiler_.profile();
    FT_CHECK(profile.steps > 0, "no profiled step");
    const double per_step = 1.0 / (profile.steps * compute_scale);
    SimStep step;
    double last_backward_ms = 0;
    for (const ProfileOp& op : profile.ops) {
      // The communicating backward is the last micro-batch's: one call at the mean time.
      step.backward_op_ms.push_back(op.backward.mean_ms() / compute_scale);
      last_backward_ms += step.backward_op_ms.back();
    }
    step.before_backward_ms =
        (profile.forward_ms() + profile.backward_ms()) * per_step - last_backward_ms;
    step.after_backward_ms = profile.outside_ms() * per_step;
    return step;
  }

  // The graph after fusion, its ready order and params: the real bucket layouts.
  std::vector<SimBucket> buckets(bool bucketing) {
    const std::vector<ParamId>& order = trainer_.executor().grad_ready_order();
    const Config& config = trainer_.config();
    return sim_buckets(bucketing ? assign_buckets(trainer_.params(), order, config.comm.bucket_mb,
                                                  config.comm.first_bucket_mb)
                                 : single_param_buckets(trainer_.params(), order),
                       trainer_.executor().graph(), trainer_.params(),
                       comm_dtype_from_name(config.comm.grad_dtype));
  }

 private:
  Trainer trainer_;
  Profiler profiler_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The profile trainer steps in the same rounds as the four modes, so that the prediction's compute
// and the measurement see the same load on the cores.
int validate(const SimulateArgs& args, const Config& config, SimReport& report,
             ProfiledTrainer& profiled, Communicator& comm) {
  const int ranks = comm.size();
  const EmulatedEquivalent emulated = emulated_equivalent(report.link, ranks);
  // In simulate_cluster's order: bucketing major, then overlap.
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (bool bucketing : {false, true})
    for (bool overlap : {false, true}) {
      Config mode = config;
      mode.comm.bucketing = bucketing;
      mode.comm.overlap = overlap;
      mode.comm.reorder_buckets = false;
      mode.comm.emulate.latency_us = emulated.latency_us;
      mode.comm.emulate.bandwidth_gbps = emulated.bandwidth_gbps;
      trainers.push_back(std::make_unique<Trainer>(mode, &comm));
      trainers.back()->set_writes_checkpoints(false);
    }
  for (int step = 0; step < args.warmup; ++step) {
    profiled.step();
    for (auto& trainer : trainers) trainer->train_step();
  }
  std::vector<std::vector<double>> step_ms(trainers.size()), exposed_ms(trainers.size());
  for (int round = 0; round < args.steps; ++round) {
    profiled.step();
    for (size_t m = 0; m < trainers.size(); ++m) {
      const StepStats stats = trainers[m]->train_step();
      step_ms[m].push_back(stats.step_ms);
      exposed_ms[m].push_back(stats.comm.exposed_ms);
    }
  }
  report = simulate_cluster(profiled.sim_step(args.compute_scale), profiled.buckets(false),
                            profiled.buckets(true), report.link, {ranks});
  report.compute_scale = args.compute_scale;
  report.grad_dtype = config.comm.grad_dtype;
  if (comm.rank() != 0) return 0;
  std::printf("%s", sim_report_markdown(report).c_str());
  std::printf(
      "\nvalidation at %d ranks: emulated link (measured) with comm.emulate.latency_us=%.4g "
      "comm.emulate.bandwidth_gbps=%.4g, the ring model's per-allreduce cost; median of %d "
      "steps\n\n",
      ranks, emulated.latency_us, emulated.bandwidth_gbps, args.steps);
  std::printf(
      "| bucketing | overlap | predicted ms | measured ms | error | predicted exposed ms | "
      "measured exposed ms |\n|---|---|---:|---:|---:|---:|---:|\n");
  nlohmann::json rows = nlohmann::json::array();
  for (size_t m = 0; m < trainers.size(); ++m) {
    const SimPrediction& p = report.predictions[m];
    const double measured = median(step_ms[m]);
    const double measured_exposed = median(exposed_ms[m]);
    const double error = 100.0 * (p.iteration_ms - measured) / measured;
    std::printf("| %s | %s | %.3f | %.3f | %+.1f%% | %.3f | %.3f |\n", p.bucketing ? "on" : "off",
                p.overlap ? "on" : "off", p.iteration_ms, measured, error, p.exposed_ms,
                measured_exposed);
    rows.push_back({{"bucketing", p.bucketing},
                    {"overlap", p.overlap},
                    {"predicted_ms", p.iteration_ms},
                    {"measured_ms", measured},
                    {"error_percent", error},
                    {"predicted_exposed_ms", p.exposed_ms},
                    {"measured_exposed_ms", measured_exposed}});
  }
  std::fflush(stdout);
  if (!args.json_path.empty()) {
    nlohmann::json json = sim_report_json(report);
    json["validation"] = {{"ranks", ranks},
                          {"emulated_link", true},
                          {"latency_us", emulated.latency_us},
                          {"bandwidth_gbps", emulated.bandwidth_gbps},
                          {"rows", rows}};
    write_output_file(args.json_path, json.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

int run_simulate(const SimulateArgs& args, Communicator* comm) {
  FT_USAGE_REQUIRE(args.steps >= 1 && args.warmup >= 0,
                   "--steps must be >= 1 and --warmup >= 0, got ", args.steps, " and ",
                   args.warmup);
  // A device a thousand times faster or slower is already far outside what a profile here says.
  FT_REQUIRE(args.compute_scale >= 1e-3 && args.compute_scale <= 1e3,
             "--compute-scale must be a number in [0.001, 1000], got ", args.compute_scale);
  FT_REQUIRE(!args.validate || (comm != nullptr && comm->size() >= 2),
             "--validate runs under mpirun with 2 or more ranks");
  FT_REQUIRE(!args.validate || args.compute_scale == 1,
             "--validate compares with this machine: drop --compute-scale");
  const LinkModel link = parse_link(args.link);
  const std::vector<int> ranks = parse_rank_list(args.ranks);  // --validate: the mpirun size
  const Config config = load_config(args.config_path, args.overrides);
  omp_set_num_threads(resolve_threads(config.train.threads));
  const bool is_root = comm == nullptr || comm->rank() == 0;

  ProfiledTrainer profiled(config, args.warmup);
  SimReport report;
  report.link = link;
  if (is_root) {
    std::printf("simulate: %s, %d warm-up + %d profiled steps, %d thread(s)\n",
                args.config_path.c_str(), args.warmup, args.steps, omp_get_max_threads());
    std::fflush(stdout);
  }
  if (args.validate) return validate(args, config, report, profiled, *comm);
  for (int step = 0; step < args.warmup + args.steps; ++step) profiled.step();
  report = simulate_cluster(profiled.sim_step(args.compute_scale), profiled.buckets(false),
                            profiled.buckets(true), link, ranks);
  report.compute_scale = args.compute_scale;
  report.grad_dtype = config.comm.grad_dtype;
  if (is_root) {
    std::printf("%s", sim_report_markdown(report).c_str());
    std::fflush(stdout);
  }
  if (is_root && !args.json_path.empty()) {
    write_output_file(args.json_path, sim_report_json(report).dump(2) + "\n");
  }
  return 0;
}

}  // namespace ft
