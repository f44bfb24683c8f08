// `fusiontrain bench`: one Trainer per variant in this process (and in every rank under mpirun),
// all from the same seed, so every variant starts from the same parameters and sees the same
// batches. After `warmup` steps each, the variants take one step each in rounds A B C A B C...,
// so machine drift hits them alike; app/bench.h turns the rounds into the table and JSON.
// Timings are rank 0's; each rank checks its own final losses against the baseline's.
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "app/bench.h"
#include "app/jobs.h"
#include "app/plan.h"
#include "app/trainer.h"
#include "core/check.h"
#include "core/timer.h"

namespace ft {
namespace {

// Progress on stderr, at most about once a second, with an ETA from the rounds so far.
class BenchProgress {
 public:
  BenchProgress(bool enabled, int rounds) : enabled_(enabled), rounds_(rounds) {}
  void round_done(int round) {
    if (!enabled_) return;
    const double now = now_ms();
    if (now - last_print_ms_ < 1000.0 && round != rounds_) return;
    last_print_ms_ = now;
    const double per_round_ms = (now - first_round_start_) / round;
    std::fprintf(stderr, "bench: round %d/%d | %.2f s/round | ETA %.1fs\n", round, rounds_,
                 per_round_ms / 1e3, per_round_ms * (rounds_ - round) / 1e3);
    std::fflush(stderr);
  }
  void start_rounds() { first_round_start_ = last_print_ms_ = now_ms(); }

 private:
  bool enabled_;
  int rounds_;
  double first_round_start_ = 0, last_print_ms_ = 0;
};

Config variant_config(const BenchArgs& args, const BenchVariant& variant, const char* flag) {
  std::vector<std::string> overrides = args.overrides;
  overrides.insert(overrides.end(), variant.overrides.begin(), variant.overrides.end());
  try {
    return load_config(args.config_path, overrides);
  } catch (const Error& error) {
    FT_FAIL(flag, ": variant '", variant.name, "': ", error.what());
  }
}

}  // namespace

int run_bench(const BenchArgs& args, Communicator* comm) {
  FT_CHECK(args.steps >= 1 && args.warmup >= 0, "--steps must be >= 1 and --warmup >= 0, got ",
           args.steps, " and ", args.warmup);
  if (!args.sweep.empty() && (!args.variants.empty() || args.ablation))
    FT_FAIL("--sweep replaces the variant list: drop --variants and --ablation");
  const bool is_root = comm == nullptr || comm->rank() == 0;
  const char* flag = args.sweep.empty() ? "--variants" : "--sweep";
  const std::vector<BenchVariant> variants =
      args.sweep.empty()
          ? expand_bench_variants(args.variants.empty() ? kDefaultBenchVariants : args.variants,
                                  args.ablation)
          : expand_bench_sweep(args.sweep);

  std::vector<Config> configs;
  for (const BenchVariant& variant : variants)
    configs.push_back(variant_config(args, variant, flag));
  omp_set_num_threads(resolve_threads(configs.front().train.threads));

  BenchRunInfo info;
  info.config_path = args.config_path;
  info.overrides = args.overrides;
  info.world_size = comm ? comm->size() : 1;
  info.threads = omp_get_max_threads();
  info.warmup = args.warmup;
  info.rounds = args.steps;
  if (is_root) {
    std::fprintf(stderr, "bench: %zu variants, %d rank(s), %d thread(s), warmup %d, %d rounds\n",
                 variants.size(), info.world_size, info.threads, args.warmup, args.steps);
    std::fflush(stderr);
  }

  // Built one after another: under mpirun each constructor's broadcast and GradSync setup are
  // collectives every rank enters in the same order.
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<BenchVariantResult> results(variants.size());
  for (size_t v = 0; v < variants.size(); ++v) {
    trainers.push_back(std::make_unique<Trainer>(configs[v], comm));
    Trainer& trainer = *trainers.back();
    BenchVariantResult& result = results[v];
    result.variant = variants[v];
    result.ops_per_step = trainer.executor().graph().ops.size();
    const int batch = configs[v].train.batch_size;
    const Plan plan =
        build_plan([&] { return trainer.task().build_graph(batch, GraphMode::kTrain); },
                   trainer.params(), configs[v].fusion);
    result.bytes_moved = plan.after.totals.bytes_moved;
    result.peak_activation_bytes = plan.after.totals.memory.peak_bytes;
  }

  for (int step = 0; step < args.warmup; ++step)
    for (auto& trainer : trainers) trainer->train_step();

  BenchProgress progress(is_root, args.steps);
  progress.start_rounds();
  for (int round = 0; round < args.steps; ++round) {
    std::vector<std::string>& order = info.order.emplace_back();
    for (size_t v = 0; v < trainers.size(); ++v) {
      const StepStats stats = trainers[v]->train_step();
      BenchVariantResult& result = results[v];
      result.step_ms.push_back(stats.step_ms);
      result.compute_ms.push_back(stats.compute_ms);
      result.comm_ms.push_back(stats.comm.comm_ms);
      result.exposed_ms.push_back(stats.comm.exposed_ms);
      result.allreduce_calls.push_back(static_cast<double>(stats.comm.allreduce_calls));
      result.final_loss = stats.loss;
      order.push_back(variants[v].name);
    }
    progress.round_done(round + 1);
  }

  const std::vector<BenchSummary> summaries = summarize_bench(results);
  if (is_root) {
    std::printf("bench: %s, %d rank(s), %d thread(s) per rank, warmup %d, %d rounds of:",
                args.config_path.c_str(), info.world_size, info.threads, args.warmup, args.steps);
    for (const BenchVariant& variant : variants) std::printf(" %s", variant.name.c_str());
    std::printf("\n\n%s", bench_table_markdown(results, summaries).c_str());
    std::fflush(stdout);
    if (!args.json_path.empty()) {
      std::ofstream json(args.json_path);
      FT_CHECK(json.good(), "cannot open --json file '", args.json_path, "' for writing");
      json << bench_to_json(info, results, summaries) << "\n";
    }
  }
  int mismatches = 0;
  for (const BenchSummary& summary : summaries) {
    if (summary.loss_ok) continue;
    ++mismatches;
    std::fprintf(
        stderr, "LOSS MISMATCH: variant '%s' final loss %.6f vs %s's %.6f (relative %.2e > %.0e)\n",
        summary.name.c_str(), summary.final_loss, summaries.front().name.c_str(),
        summaries.front().final_loss, summary.loss_relative_error, kBenchLossTolerance);
  }
  return mismatches > 0 ? 1 : 0;
}

}  // namespace ft
