// What `fusiontrain bench` computes, apart from running it: the variant list (named strategies,
// the --ablation names, ad-hoc `name:key=value;...` variants and --sweep values), the statistics
// of the interleaved rounds (median, p10, p90, speedup over the baseline with its p10-p90 interval
// of per-round ratios), the final-loss check, and the Markdown table and JSON
// (app/analysis/bench.cpp; the table, throughput and JSON output in app/analysis/bench_report.cpp).
// app/jobs/bench_job.cpp runs the Trainers and fills BenchVariantResult; everything here is pure so
// tests check it without training. Thread safety: pure functions.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "app/analysis/machine_load.h"
#include "core/launch_counter.h"
#include "fusion/pass_registry.h"

namespace ft {

// One column of the comparison: a name and the config overrides (section.key=value) applied after
// the config file and its --set overrides.
struct BenchVariant {
  std::string name;
  std::vector<std::string> overrides;
};

// The default --variants list, in run order within a round.
extern const char* const kDefaultBenchVariants;  // "unfused,horizontal,vertical,bucketing,..."
// Final losses must agree with the baseline's within this relative tolerance: the variants run
// the same math on the same parameters and batches, so they differ by rounding only.
constexpr double kBenchLossTolerance = 1e-3;
// Against a baseline of the other train.precision: one step's loss moves by a few percent between
// fp32 and bf16 (bf16's operands carry 8 bits), so only a larger gap is a mismatch.
constexpr double kBenchCrossPrecisionLossTolerance = 5e-2;

// Fewer timed rounds than this make p10-p90 (and so "within noise") meaningless: with 2 rounds
// p10 and p90 are just the two values, close together by chance.
constexpr int kBenchMinRounds = 5;
// One warning line (no newline) when `rounds` < kBenchMinRounds; empty otherwise.
std::string bench_rounds_warning(int rounds);

// Every named variant --variants accepts ("fused" names `all` and runs as "all"), and the fusion
// pass keys --ablation removes one by one. The pass keys come from `passes` (a test hands its own).
std::vector<std::string> bench_variant_names(const PassRegistry& passes = PassRegistry::standard());
// The vertical, then the horizontal keys of `passes`, each family in list order:
// "fusion.vertical.gemm_epilogue", ..., "fusion.horizontal.qkv", ...
std::vector<std::string> bench_ablation_keys(const PassRegistry& passes = PassRegistry::standard());

// Expands --variants (comma-separated names or `name:key=value;key=value` ad-hoc variants, which
// apply on top of the config as given) and, with `ablation`, appends `all-<pass>` for every
// fusion pass key of `passes` and `all-bucketing`, `all-overlap`. The named variants "horizontal"
// and "vertical" switch off every key of `passes` of the other family. Throws ft::Error naming
// --variants and the allowed names for an unknown name, an empty entry, a duplicate, or an
// override without '='.
std::vector<BenchVariant> expand_bench_variants(
    const std::string& list, bool ablation, const PassRegistry& passes = PassRegistry::standard());

// --sweep key=v1,v2,...: one variant per value, named "key=value", on top of the config. Throws
// ft::Error naming --sweep for a missing '=', an empty key or an empty value.
std::vector<BenchVariant> expand_bench_sweep(const std::string& spec);

// Linear-interpolated percentile, p in [0, 1]. REQUIRES: values non-empty.
double bench_percentile(std::vector<double> values, double p);

// What one variant measured, one entry per timed round (per-step means for the comm columns).
struct BenchVariantResult {
  BenchVariant variant;
  std::string precision = "fp32";  // its train.precision: sets the final-loss tolerance
  std::vector<double> step_ms, compute_ms, comm_ms, exposed_ms;
  // cpu: wall time inside gemm() (core/gemm.h) per step; empty on cuda, where it is not timed.
  std::vector<double> gemm_ms;
  std::vector<double> conv_ms;  // the same for convolutions (core/gemm.h's ConvTimeGuard)
  std::vector<double> allreduce_calls;
  std::vector<double> bytes_reduced;  // gradient payload per step, in comm.grad_dtype
  size_t ops_per_step = 0;            // ops of the executed training graph
  double bytes_moved = 0;             // app/analysis/plan.h: forward bytes of the executed graph
  double peak_activation_bytes = 0;   // app/analysis/plan.h: train-mode peak
  double final_loss = 0;
  nlohmann::json profile;  // rank 0: {"top_ops": [...], "advice": [...]}; null = not profiled
  // Rank 0 on cuda: the launches of this variant's timed rounds, summed (a delta around each of
  // its steps, since the rounds interleave variants). Empty on cpu, where nothing is counted.
  std::optional<LaunchCounts> launches;
  // For throughput (app/analysis/throughput.h): items per step over all ranks and micro-batches,
  // their unit, and the model FLOPs of one rank's step (the eager graph's forward + backward).
  double items_per_step = 0;
  std::string item_unit;
  double model_flops_per_rank = 0;
};

// Launches per step (`launches` over `rounds`) as the table shows them: "812 (k 650, gemm 120,
// conv 0, copy 42)", with one decimal where a count does not divide evenly; "-" when empty.
std::string format_launches_per_step(const std::optional<LaunchCounts>& launches, size_t rounds);

// The statistics of one variant against the baseline (the first result).
struct BenchSummary {
  std::string name;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  double speedup = 1, speedup_low = 1, speedup_high = 1;  // median, p10, p90 of per-round ratios
  // Baseline median / this median: beside `speedup`, so a row whose median is slower (ratio
  // below 1) while the median of per-round ratios is above 1 shows both.
  double median_ratio = 1;
  bool baseline = false;
  bool within_noise = false;  // the interval straddles 1.0
  double compute_ms = 0, comm_ms = 0, exposed_ms = 0, allreduces_per_step = 0;  // medians
  double bytes_reduced_per_step = 0;  // median; 0 on 1 rank, where nothing is reduced
  double gemm_ms = -1;                // median; -1 when not timed (cuda)
  double conv_ms = 0;                 // median; 0 when not timed or no convolution ran
  double final_loss = 0;
  double loss_relative_error = 0;               // |loss - baseline loss| / |baseline loss|
  double loss_tolerance = kBenchLossTolerance;  // kBenchCrossPrecision... across precisions
  bool loss_ok = true;                          // loss_relative_error within loss_tolerance
  std::string note;  // after the speedup, e.g. "no communication on 1 rank"
};

// A variant that differs from another only in comm.* keys (bucketing, overlap, all-bucketing,
// all-overlap, or ad-hoc / sweep overrides all under comm.): on 1 rank nothing is reduced, so it
// runs the same step as its counterpart and any speedup is noise.
bool bench_comm_only_variant(const BenchVariant& variant);
// On 1 rank, notes "no communication on 1 rank" on every comm-only variant but the baseline.
void note_single_rank_comm_variants(const std::vector<BenchVariantResult>& results, int world_size,
                                    std::vector<BenchSummary>* summaries);

// One line per variant: throughput at its median step time ("all: 12.3k tokens/s, 0.45 model
// TFLOP/s per rank (MFU 0.7% of 67 TFLOP/s)"); peak_tflops <= 0 leaves MFU out.
std::string bench_throughput_text(const std::vector<BenchVariantResult>& results,
                                  const std::vector<BenchSummary>& summaries, double peak_tflops);

// REQUIRES: results non-empty, every step_ms of equal non-zero length (one per round).
std::vector<BenchSummary> summarize_bench(const std::vector<BenchVariantResult>& results);

// The Markdown table (header, separator, one row per variant) and the tolerance line.
std::string bench_table_markdown(const std::vector<BenchVariantResult>& results,
                                 const std::vector<BenchSummary>& summaries);

// Everything as JSON text: run settings, `order` (the variants run in each round, as run), and
// per variant every column plus its per-round step_ms and, when profiled, its "profile".
struct BenchRunInfo {
  std::string config_path;
  std::vector<std::string> overrides;
  int world_size = 1, threads = 1, warmup = 0, rounds = 0;
  double peak_tflops = 0;                       // per rank, for MFU; 0 = none given
  std::vector<std::vector<std::string>> order;  // one list per timed round
  MachineLoad
      machine_load;  // app/analysis/machine_load.h; in the JSON as "machine_load" when measured
};
std::string bench_to_json(const BenchRunInfo& info, const std::vector<BenchVariantResult>& results,
                          const std::vector<BenchSummary>& summaries);

}  // namespace ft
