// `fusiontrain bench`: one Trainer per variant in this process (and in every rank under mpirun),
// all from the same seed, so every variant starts from the same parameters and sees the same
// batches. After `warmup` steps each, the variants take one step each in rounds A B C A B C...,
// so machine drift hits them alike; app/analysis/bench.h turns the rounds into the table and JSON.
// Every variant is profiled (app/analysis/profiler.h) during its timed rounds on rank 0; --trace
// writes the first timed rounds of every variant into one trace file (app/training/bench_runner.h).
// Timings are rank 0's; each rank checks its own final losses against the baseline's.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>

#include "app/analysis/bench.h"
#include "app/analysis/machine_load.h"
#include "app/analysis/plan.h"
#include "app/jobs/jobs.h"
#include "app/training/bench_runner.h"
#include "app/training/trace.h"
#include "app/training/trainer.h"
#include "comm/gather.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/gemm.h"
#include "core/launch_counter.h"
#include "core/timer.h"

namespace ft {
namespace {

constexpr int kTracedRounds = 3;

// Progress on stderr, at most about once a second, with an ETA from the rounds so far.
class BenchProgress {
 public:
  BenchProgress(bool enabled, int rounds, const char* label)
      : enabled_(enabled), rounds_(rounds), label_(label) {}
  void round_done(int round) {
    if (!enabled_) return;
    const double now = now_ms();
    if (now - last_print_ms_ < 1000.0 && round != rounds_) return;
    last_print_ms_ = now;
    const double per_round_ms = (now - first_round_start_) / round;
    std::fprintf(stderr, "%s: round %d/%d | %.2f s/round | ETA %.1fs\n", label_, round, rounds_,
                 per_round_ms / 1e3, per_round_ms * (rounds_ - round) / 1e3);
    std::fflush(stderr);
  }
  void start_rounds() { first_round_start_ = last_print_ms_ = now_ms(); }

 private:
  bool enabled_;
  int rounds_;
  const char* label_;
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

// Every rank adopts rank 0's step times, so decisions taken on them agree across ranks.
void share_root_timings(Communicator* comm, std::vector<BenchVariantResult>& results) {
  if (comm == nullptr || comm->size() == 1) return;
  std::vector<float> times;
  for (const BenchVariantResult& result : results)
    for (double ms : result.step_ms) times.push_back(static_cast<float>(ms));
  comm->broadcast(times.data(), times.size(), 0);
  size_t next = 0;
  for (BenchVariantResult& result : results)
    for (double& ms : result.step_ms) ms = times[next++];
}

// Gathers every variant's trace events onto rank 0 into one file, one process per
// (variant, rank).
void write_bench_trace(Communicator* comm,
                       const std::vector<std::unique_ptr<TraceRecorder>>& recorders,
                       const std::vector<BenchVariant>& variants, const std::string& path,
                       int traced_rounds) {
  const int world_size = comm ? comm->size() : 1;
  nlohmann::json mine = nlohmann::json::array();
  for (size_t v = 0; v < recorders.size(); ++v) {
    for (nlohmann::json event : recorders[v]->events()) {
      const int rank = event["pid"].get<int>();
      event["pid"] = static_cast<int>(v) * world_size + rank;
      if (event["ph"] == "M" && event["name"] == "process_name")
        event["args"]["name"] = variants[v].name + " rank " + std::to_string(rank);
      if (event["ph"] == "M" && event["name"] == "process_sort_index")
        event["args"]["sort_index"] = event["pid"];
      mine.push_back(std::move(event));
    }
  }
  nlohmann::json events = nlohmann::json::array();
  if (world_size == 1) {
    events = std::move(mine);
  } else {
    const std::vector<std::string> per_rank = gather_strings(*comm, mine.dump(), 0);
    if (comm->rank() != 0) return;
    for (const std::string& text : per_rank)
      for (nlohmann::json& event : nlohmann::json::parse(text)) events.push_back(std::move(event));
  }
  std::vector<std::string> names;
  for (const BenchVariant& variant : variants) names.push_back(variant.name);
  const size_t count = events.size();
  const nlohmann::json trace = {{"traceEvents", std::move(events)},
                                {"displayTimeUnit", "ms"},
                                {"otherData",
                                 {{"job", "bench"},
                                  {"variants", names},
                                  {"world_size", world_size},
                                  {"pid", "variant index x world_size + rank"},
                                  {"traced_rounds", traced_rounds}}}};
  write_file_atomic(path, trace.dump());
  std::printf("trace: %zu events of %d timed round(s) of %zu variant(s) written to %s\n", count,
              traced_rounds, variants.size(), path.c_str());
  std::fflush(stdout);
}

}  // namespace

nlohmann::json profile_top_ops_json(const Profile& profile, int top) {
  std::vector<const ProfileOp*> ops;
  for (const ProfileOp& op : profile.ops) ops.push_back(&op);
  std::stable_sort(ops.begin(), ops.end(), [](const ProfileOp* a, const ProfileOp* b) {
    return a->total_ms() > b->total_ms();
  });
  const double steps = std::max(1, profile.steps);
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < ops.size() && static_cast<int>(i) < top; ++i)
    rows.push_back({{"name", ops[i]->name},
                    {"kind", op_kind_name(ops[i]->kind)},
                    {"forward_ms", ops[i]->forward.total_ms / steps},
                    {"backward_ms", ops[i]->backward.total_ms / steps},
                    {"share", profile.share(ops[i]->total_ms())}});
  return rows;
}

std::string format_top_ops(const std::string& variant, const Profile& profile, int top) {
  std::string text = "top " + std::to_string(top) + " ops of " + variant + " (ms per step over " +
                     std::to_string(profile.steps) + " steps):\n";
  char line[256];
  for (const nlohmann::json& row : profile_top_ops_json(profile, top)) {
    std::snprintf(line, sizeof(line), "  %-32s %-18s fwd %7.3f  bwd %7.3f  %5.1f%%\n",
                  row["name"].get<std::string>().c_str(), row["kind"].get<std::string>().c_str(),
                  row["forward_ms"].get<double>(), row["backward_ms"].get<double>(),
                  100.0 * row["share"].get<double>());
    text += line;
  }
  return text;
}

BenchRun run_bench_variants(const std::vector<Config>& configs,
                            const std::vector<BenchVariant>& variants,
                            const BenchRunOptions& options, Communicator* comm) {
  FT_CHECK(!configs.empty() && configs.size() == variants.size(), "bench: ", configs.size(),
           " configs for ", variants.size(), " variants");
  FT_CHECK(options.rounds >= 1 && options.warmup >= 0, "--steps must be >= 1 and --warmup >= 0");
  for (size_t v = 0; v < configs.size(); ++v)
    FT_REQUIRE(!(configs[v].fusion.enabled && configs[v].fusion.cuda_graph) ||
                   options.warmup > Trainer::kEagerStepsBeforeCapture,
               "bench: variant '", variants[v].name, "' replays a CUDA graph captured at its step ",
               Trainer::kEagerStepsBeforeCapture + 1, ", so --warmup must be at least ",
               Trainer::kEagerStepsBeforeCapture + 1, " (got ", options.warmup,
               ") to keep the capture out of the timed rounds");
  const bool is_root = comm == nullptr || comm->rank() == 0;
  BenchRun run;
  run.info.world_size = comm ? comm->size() : 1;
  run.info.threads = omp_get_max_threads();
  run.info.warmup = options.warmup;
  run.info.rounds = options.rounds;

  // Built one after another: under mpirun each constructor's broadcast and GradSync setup are
  // collectives every rank enters in the same order.
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<std::unique_ptr<Profiler>> profilers;
  run.results.resize(variants.size());
  for (size_t v = 0; v < variants.size(); ++v) {
    trainers.push_back(std::make_unique<Trainer>(configs[v], comm));
    trainers.back()->set_writes_checkpoints(false);
    Trainer& trainer = *trainers.back();
    profilers.push_back(std::make_unique<Profiler>(trainer.executor().graph(), 0));
    if (is_root) trainer.executor().set_observer(profilers.back().get());
    BenchVariantResult& result = run.results[v];
    result.variant = variants[v];
    result.precision = configs[v].train.precision;
    if (is_root && configs[v].train.device == "cuda") result.launches = LaunchCounts{};
    result.ops_per_step = trainer.executor().graph().ops.size();
    const int batch = configs[v].train.batch_size;
    const Plan plan =
        build_plan([&] { return trainer.task().build_graph(batch, GraphMode::kTrain); },
                   trainer.params(), configs[v].fusion);
    result.bytes_moved = plan.after.totals.bytes_moved;
    result.items_per_step = static_cast<double>(trainer.items_per_step());
    result.item_unit = trainer.task().item_unit();
    result.model_flops_per_rank = plan.before.totals.flops * configs[v].train.grad_accum;
    result.peak_activation_bytes = plan.after.totals.memory.peak_bytes;
  }
  std::vector<std::unique_ptr<TraceRecorder>> recorders;
  const int traced_rounds = std::min(kTracedRounds, options.rounds);
  if (!options.trace_path.empty()) {
    const double zero_ms = shared_trace_zero_ms(comm);
    for (size_t v = 0; v < variants.size(); ++v) {
      recorders.push_back(std::make_unique<TraceRecorder>(comm ? comm->rank() : 0, zero_ms));
      recorders.back()->set_next(is_root ? profilers[v].get() : nullptr);
    }
  }

  for (int step = 0; step < options.warmup; ++step)
    for (auto& trainer : trainers) trainer->train_step();

  BenchProgress progress(is_root && options.progress, options.rounds, options.label);
  progress.start_rounds();
  // The share of each step outside the GEMMs (cpu), which is where fusion can act.
  set_gemm_timing(true);
  for (int round = 0; round < options.rounds; ++round) {
    std::vector<std::string>& order = run.info.order.emplace_back();
    const bool traced = round < static_cast<int>(recorders.empty() ? 0 : traced_rounds);
    for (size_t v = 0; v < trainers.size(); ++v) {
      Trainer& trainer = *trainers[v];
      if (traced) {
        recorders[v]->begin_step(trainer.step() + 1);
        trainer.executor().set_observer(recorders[v].get());
        if (GradSync* sync = trainer.grad_sync()) sync->set_record_timings(true);
      }
      BenchVariantResult& result = run.results[v];
      profilers[v]->begin_step();
      const LaunchCounts launches_before = launch_counts();
      const double gemm_before = gemm_timed_ms(), conv_before = conv_timed_ms();
      const StepStats stats = trainer.train_step();
      if (trainer.params().device() == Device::kCpu) {
        result.gemm_ms.push_back(gemm_timed_ms() - gemm_before);
        result.conv_ms.push_back(conv_timed_ms() - conv_before);
      }
      if (result.launches) *result.launches += launch_counts() - launches_before;
      profilers[v]->end_step(stats.step_ms);
      if (traced) {
        recorders[v]->end_step(stats.comm);
        trainer.executor().set_observer(is_root ? profilers[v].get() : nullptr);
        if (GradSync* sync = trainer.grad_sync()) sync->set_record_timings(false);
      }
      result.step_ms.push_back(stats.step_ms);
      result.compute_ms.push_back(stats.compute_ms);
      result.comm_ms.push_back(stats.comm.comm_ms);
      result.exposed_ms.push_back(stats.comm.exposed_ms);
      result.allreduce_calls.push_back(static_cast<double>(stats.comm.allreduce_calls));
      result.bytes_reduced.push_back(static_cast<double>(stats.comm.bytes_reduced));
      result.final_loss = stats.loss;
      order.push_back(variants[v].name);
    }
    progress.round_done(round + 1);
  }
  set_gemm_timing(false);
  for (auto& trainer : trainers) trainer->executor().set_observer(nullptr);
  run.steps_executed = static_cast<int>(variants.size()) * (options.warmup + options.rounds);
  if (!recorders.empty())
    write_bench_trace(comm, recorders, variants, options.trace_path, traced_rounds);
  share_root_timings(comm, run.results);

  if (is_root) run.advice_options.dispatch_ms = measure_dispatch_ms();
  for (size_t v = 0; v < variants.size(); ++v) {
    run.profiles.push_back(profilers[v]->profile());
    run.advice.push_back(is_root ? advise_fusion(trainers[v]->executor().graph(), run.profiles[v],
                                                 configs[v].fusion, run.advice_options)
                                 : std::vector<FusionAdvice>{});
    if (is_root)
      run.results[v].profile = {{"top_ops", profile_top_ops_json(run.profiles[v], 10)},
                                {"advice", advice_json(run.advice[v], run.advice_options)}};
  }
  return run;
}

// A step time compares variants only when each does the same work per step: a variant that
// changes the batch, the accumulation or the model (once "x 4.373x" for a quarter of the work)
// is refused, naming the key and both values. model.conv_algorithm is not work: each value
// computes the same convolutions, and comparing the algorithms is what a user benches. train.trace
// would time ops on the host inside the timed rounds, so bench takes --trace instead.
void require_same_work_per_step(const std::vector<Config>& configs,
                                const std::vector<BenchVariant>& variants, const char* flag) {
  auto work_keys = [](const Config& config) {
    std::map<std::string, std::string> keys;
    for (const auto& [key, value] : flatten_config(config))
      if ((key.rfind("model.", 0) == 0 && key != "model.conv_algorithm") ||
          key == "train.batch_size" || key == "train.grad_accum")
        keys[key] = value;
    return keys;
  };
  const std::map<std::string, std::string> first = work_keys(configs.front());
  for (size_t v = 0; v < configs.size(); ++v) {
    FT_USAGE_REQUIRE(configs[v].train.trace.empty(), flag, ": variant '", variants[v].name,
                     "' sets train.trace, which bench does not write (its timing would include "
                     "the tracing); use bench --trace FILE for a trace of every variant");
    for (const auto& [key, value] : work_keys(configs[v]))
      FT_USAGE_REQUIRE(first.at(key) == value, flag, ": variant '", variants[v].name, "' sets ",
                       key, " = ", value, " where '", variants.front().name, "' has ",
                       first.at(key),
                       ": it does another amount of work per step, so its step time compares "
                       "with nothing; bench one config per ",
                       key, " and compare their items/s instead");
  }
}

int run_bench(const BenchArgs& args, Communicator* comm) {
  FT_USAGE_REQUIRE(args.steps >= 1 && args.warmup >= 0,
                   "--steps must be >= 1 and --warmup >= 0, got ", args.steps, " and ",
                   args.warmup);
  FT_REQUIRE(args.peak_tflops >= 0 && std::isfinite(args.peak_tflops),
             "--peak-tflops must be >= 0 and finite (0 = no MFU), got ", args.peak_tflops);
  if (!args.sweep.empty() && (!args.variants.empty() || args.ablation))
    FT_USAGE_FAIL("--sweep replaces the variant list: drop --variants and --ablation");
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
  require_same_work_per_step(configs, variants, flag);
  omp_set_num_threads(resolve_threads(configs.front().train.threads));
  if (is_root) {
    std::fprintf(stderr, "bench: %zu variants, %d rank(s), %d thread(s), warmup %d, %d rounds\n",
                 variants.size(), comm ? comm->size() : 1, omp_get_max_threads(), args.warmup,
                 args.steps);
    std::fflush(stderr);
  }

  BenchRunOptions options;
  options.warmup = args.warmup;
  options.rounds = args.steps;
  options.trace_path = args.trace_path;
  const MachineLoadWatch machine_load;
  BenchRun run = run_bench_variants(configs, variants, options, comm);
  run.info.machine_load = machine_load.finish();
  run.info.config_path = args.config_path;
  run.info.peak_tflops = args.peak_tflops;
  run.info.overrides = args.overrides;
  const std::vector<BenchVariantResult>& results = run.results;

  std::vector<BenchSummary> summaries = summarize_bench(results);
  note_single_rank_comm_variants(results, run.info.world_size, &summaries);
  if (is_root) {
    std::printf("bench: %s, %d rank(s), %d thread(s) per rank, warmup %d, %d rounds of:",
                args.config_path.c_str(), run.info.world_size, run.info.threads, args.warmup,
                args.steps);
    for (const BenchVariant& variant : variants) std::printf(" %s", variant.name.c_str());
    std::printf("\n");
    // Next to the table, so it travels with the numbers it qualifies.
    const std::string warning = bench_rounds_warning(args.steps);
    if (!warning.empty()) std::printf("%s\n", warning.c_str());
    const std::string busy = machine_load_warning(run.info.machine_load);
    if (!busy.empty()) std::printf("%s\n", busy.c_str());
    std::printf("\n%s", bench_table_markdown(results, summaries).c_str());
    std::printf("\n%s", bench_throughput_text(results, summaries, args.peak_tflops).c_str());
    // The two ends of the comparison, when both ran.
    for (const char* name : {"all", "unfused"})
      for (size_t v = 0; v < variants.size(); ++v)
        if (variants[v].name == name)
          std::printf("\n%s", format_top_ops(name, run.profiles[v], 5).c_str());
    std::fflush(stdout);
    if (!args.json_path.empty()) {
      write_output_file(args.json_path, bench_to_json(run.info, results, summaries) + "\n");
    }
  }
  int mismatches = 0;
  for (const BenchSummary& summary : summaries) {
    if (summary.loss_ok) continue;
    ++mismatches;
    std::fprintf(
        stderr, "LOSS MISMATCH: variant '%s' final loss %.6f vs %s's %.6f (relative %.2e > %.0e)\n",
        summary.name.c_str(), summary.final_loss, summaries.front().name.c_str(),
        summaries.front().final_loss, summary.loss_relative_error, summary.loss_tolerance);
  }
  return mismatches > 0 ? 1 : 0;
}

}  // namespace ft
