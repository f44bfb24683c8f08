// `fusiontrain bench`'s variant expansion and statistics (app/analysis/bench.h): the default list
// and its overrides, --ablation, ad hoc variants, sweeps, the speedup and ratio of medians, the
// machine-load warning, launches per step and throughput. The binary itself is in
// bench_binary_test.cpp.
#include "app/analysis/bench.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "app/analysis/machine_load.h"
#include "core/check.h"
#include "run_command.h"

namespace ft {
namespace {

const std::vector<std::string> kDefaultNames = {"unfused",   "horizontal", "vertical",
                                                "bucketing", "overlap",    "all"};

std::vector<std::string> names_of(const std::vector<BenchVariant>& variants) {
  std::vector<std::string> names;
  for (const BenchVariant& variant : variants) names.push_back(variant.name);
  return names;
}

bool has_override(const BenchVariant& variant, const std::string& override_text) {
  for (const std::string& text : variant.overrides)
    if (text == override_text) return true;
  return false;
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(BenchVariants, DefaultListAndItsOverrides) {
  const std::vector<BenchVariant> variants = expand_bench_variants(kDefaultBenchVariants, false);
  EXPECT_EQ(names_of(variants), kDefaultNames);
  EXPECT_TRUE(has_override(variants[0], "fusion.enabled=false"));
  EXPECT_TRUE(has_override(variants[0], "comm.bucketing=false"));
  EXPECT_TRUE(has_override(variants[0], "comm.overlap=false"));
  EXPECT_TRUE(has_override(variants[1], "fusion.vertical.gemm_epilogue=false"));
  EXPECT_FALSE(has_override(variants[1], "fusion.horizontal.qkv=false"));
  EXPECT_TRUE(has_override(variants[2], "fusion.horizontal.qkv=false"));
  EXPECT_FALSE(has_override(variants[2], "fusion.vertical.gemm_epilogue=false"));
  EXPECT_TRUE(has_override(variants[4], "comm.bucketing=true"));  // overlap needs buckets
  EXPECT_TRUE(has_override(variants[4], "comm.overlap=true"));
  EXPECT_TRUE(has_override(variants[5], "fusion.enabled=true"));
}

TEST(BenchVariants, AblationAppendsAllMinusEachPass) {
  const std::vector<std::string> expected_tail = {"all-gemm_epilogue", "all-residual_layernorm",
                                                  "all-classifier",    "all-attention",
                                                  "all-bn_relu",       "all-cast",
                                                  "all-qkv",           "all-batched_layernorm",
                                                  "all-multi_tensor",  "all-conv_shortcut",
                                                  "all-bucketing",     "all-overlap"};
  const std::vector<BenchVariant> variants = expand_bench_variants("unfused,all", true);
  std::vector<std::string> expected = {"unfused", "all"};
  expected.insert(expected.end(), expected_tail.begin(), expected_tail.end());
  EXPECT_EQ(names_of(variants), expected);
  EXPECT_TRUE(has_override(variants[2], "fusion.vertical.gemm_epilogue=false"));
  EXPECT_TRUE(has_override(variants[8], "fusion.horizontal.qkv=false"));
  EXPECT_TRUE(has_override(variants[12], "comm.bucketing=false"));
  EXPECT_TRUE(has_override(variants[13], "comm.overlap=false"));
}

TEST(BenchVariants, AdHocVariantAndErrors) {
  const std::vector<BenchVariant> variants =
      expand_bench_variants("unfused,wide:fusion.max_ops=8;comm.bucket_mb=16", false);
  ASSERT_EQ(variants.size(), 2u);
  EXPECT_EQ(variants[1].name, "wide");
  EXPECT_EQ(variants[1].overrides,
            (std::vector<std::string>{"fusion.max_ops=8", "comm.bucket_mb=16"}));
  const std::string unknown = error_of([] { expand_bench_variants("unfused,fastest", false); });
  EXPECT_NE(unknown.find("--variants"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("'fastest'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("unfused, horizontal, vertical"), std::string::npos) << unknown;
  EXPECT_NE(error_of([] { expand_bench_variants("x:novalue", false); }).find("key=value"),
            std::string::npos);
  EXPECT_NE(error_of([] { expand_bench_variants("all,all", false); }).find("twice"),
            std::string::npos);
}

TEST(BenchVariants, SweepMakesOneVariantPerValue) {
  const std::vector<BenchVariant> variants = expand_bench_sweep("comm.bucket_mb=0.25,1,4");
  EXPECT_EQ(names_of(variants), (std::vector<std::string>{"comm.bucket_mb=0.25", "comm.bucket_mb=1",
                                                          "comm.bucket_mb=4"}));
  EXPECT_EQ(variants[2].overrides, (std::vector<std::string>{"comm.bucket_mb=4"}));
  for (const char* bad : {"comm.bucket_mb", "=1,2", "comm.bucket_mb=", "comm.bucket_mb=1,,2"}) {
    const std::string message = error_of([&] { expand_bench_sweep(bad); });
    EXPECT_NE(message.find("--sweep"), std::string::npos) << bad << ": " << message;
  }
}

BenchVariantResult result_with(const std::string& name, std::vector<double> step_ms, double loss) {
  BenchVariantResult result;
  result.variant.name = name;
  result.step_ms = step_ms;
  result.compute_ms = step_ms;
  result.comm_ms = result.exposed_ms = result.allreduce_calls = std::vector<double>(step_ms.size());
  result.final_loss = loss;
  return result;
}

TEST(BenchStats, SpeedupIsTheMedianOfPerRoundRatios) {
  // Round 3 is slow for everyone: per-round ratios stay 2, a ratio of medians would not.
  const std::vector<BenchVariantResult> results = {
      result_with("unfused", {10, 10, 40, 10, 10}, 3.0),
      result_with("fast", {5, 5, 20, 5, 5}, 3.0 * (1 + 0.5 * kBenchLossTolerance)),
      result_with("noisy", {9, 11, 40, 12, 8}, 3.0 * (1 + 2 * kBenchLossTolerance))};
  const std::vector<BenchSummary> summaries = summarize_bench(results);
  EXPECT_TRUE(summaries[0].baseline);
  EXPECT_DOUBLE_EQ(summaries[1].speedup, 2.0);
  EXPECT_DOUBLE_EQ(summaries[1].speedup_low, 2.0);
  EXPECT_FALSE(summaries[1].within_noise);
  EXPECT_TRUE(summaries[1].loss_ok);
  EXPECT_DOUBLE_EQ(summaries[0].median_ms, 10.0);
  EXPECT_TRUE(summaries[2].within_noise);
  EXPECT_FALSE(summaries[2].loss_ok);
  const std::string table = bench_table_markdown(results, summaries);
  EXPECT_NE(table.find("within noise"), std::string::npos) << table;
  EXPECT_NE(table.find("LOSS MISMATCH"), std::string::npos) << table;
  EXPECT_NE(table.find("tolerance: relative 1e-03"), std::string::npos) << table;
}

// A slower median beside a per-round speedup above 1 is shown, not hidden: the table has the
// ratio of medians beside the median of per-round ratios, and the JSON has median_ratio.
TEST(BenchStats, RatioOfMediansSitsBesideTheMedianRatio) {
  const std::vector<BenchVariantResult> results = {
      result_with("unfused", {10, 20, 10, 20, 10}, 3.0),
      result_with("mixed", {9, 19, 9, 21, 11}, 3.0)};
  const std::vector<BenchSummary> summaries = summarize_bench(results);
  EXPECT_DOUBLE_EQ(summaries[0].median_ratio, 1.0);
  EXPECT_DOUBLE_EQ(summaries[1].median_ratio, 10.0 / 11.0);
  EXPECT_GT(summaries[1].speedup, 1.0);
  const std::string table = bench_table_markdown(results, summaries);
  EXPECT_NE(table.find("| speedup (p10-p90) | median ratio |"), std::string::npos) << table;
  EXPECT_NE(table.find(" within noise | 0.909x |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 1.000 (baseline) | 1.000x |"), std::string::npos) << table;
  BenchRunInfo info;
  const nlohmann::json json = nlohmann::json::parse(bench_to_json(info, results, summaries));
  EXPECT_DOUBLE_EQ(json["variants"][1]["median_ratio"].get<double>(), 10.0 / 11.0);
  EXPECT_FALSE(json.contains("machine_load")) << "no reading was taken";
}

// The gradient bytes each step reduced (comm.grad_dtype's payload) are the median over rounds,
// in the table and the JSON; "-" where nothing was reduced, not a measured 0.
TEST(BenchStats, ReducedBytesPerStepAreTheMedianOverRounds) {
  std::vector<BenchVariantResult> results = {result_with("grad_fp32", {10, 10, 10}, 3.0),
                                             result_with("grad_bf16", {8, 8, 8}, 3.0),
                                             result_with("one_rank", {9, 9, 9}, 3.0)};
  results[0].bytes_reduced = {4 << 20, 4 << 20, 4 << 20};
  results[1].bytes_reduced = {2 << 20, 3 << 20, 2 << 20};
  const std::vector<BenchSummary> summaries = summarize_bench(results);
  EXPECT_DOUBLE_EQ(summaries[1].bytes_reduced_per_step, 2 << 20);
  const std::string table = bench_table_markdown(results, summaries);
  EXPECT_NE(table.find("| allreduces | reduced/step | bytes moved |"), std::string::npos) << table;
  EXPECT_NE(table.find("| 0 | 4.00MiB | "), std::string::npos) << table;
  EXPECT_NE(table.find("| 0 | 2.00MiB | "), std::string::npos) << table;
  EXPECT_NE(table.find("| 0 | - | "), std::string::npos) << table;
  BenchRunInfo info;
  const nlohmann::json json = nlohmann::json::parse(bench_to_json(info, results, summaries));
  EXPECT_DOUBLE_EQ(json["variants"][1]["bytes_reduced_per_step"].get<double>(), 2 << 20);
}

TEST(BenchVariants, FusedIsAnotherNameOfAll) {
  const std::vector<BenchVariant> variants = expand_bench_variants("unfused,fused", false);
  EXPECT_EQ(names_of(variants), (std::vector<std::string>{"unfused", "all"}));
  EXPECT_EQ(variants[1].overrides, expand_bench_variants("all", false)[0].overrides);
  const std::vector<std::string> names = bench_variant_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "fused"), names.end());
  EXPECT_NE(error_of([] { expand_bench_variants("nope", false); }).find("fused"),
            std::string::npos);
  EXPECT_NE(error_of([] { expand_bench_variants("all,fused", false); }).find("appears twice"),
            std::string::npos);
}

// Writes fake /proc files into `dir`: the load average, the machine's cpu line (user nice
// system idle iowait irq softirq steal) and this process's stat line with utime and stime.
void write_fake_proc(const std::string& dir, double load1, const std::string& cpu_line, int utime,
                     int stime) {
  std::ofstream(dir + "/loadavg") << load1 << " 0.50 0.40 1/123 4567\n";
  std::ofstream(dir + "/stat") << "cpu  " << cpu_line << " 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
  std::ofstream(dir + "/self_stat") << "42 (fusion (train)) R 1 42 42 0 -1 4194304 100 0 0 0 "
                                    << utime << " " << stime << " 0 0 20 0 1 0 100 0\n";
}

MachineLoadPaths fake_paths(const std::string& dir) {
  return {dir + "/loadavg", dir + "/stat", dir + "/self_stat"};
}

TEST(BenchMachineLoad, ReadsProcAndJudgesTheRule) {
  const std::string dir = ::testing::TempDir();
  write_fake_proc(dir, 3.25, "100 0 50 800 50 0 0 0", 40, 10);
  const MachineLoadSample start = read_machine_load(fake_paths(dir));
  ASSERT_TRUE(start.ok);
  EXPECT_DOUBLE_EQ(start.load1, 3.25);
  EXPECT_DOUBLE_EQ(start.busy_jiffies, 150);
  EXPECT_DOUBLE_EQ(start.total_jiffies, 1000);
  EXPECT_DOUBLE_EQ(start.self_jiffies, 50);
  EXPECT_FALSE(read_machine_load(fake_paths(dir + "/missing")).ok);

  // Quiet: 1000 jiffies pass, this process used 500 of the 520 busy ones; load 1.2 < 4 - 0.5.
  MachineLoadSample a = start, b = start;
  a.load1 = 1.2;
  b.total_jiffies += 1000;
  b.busy_jiffies += 520;
  b.self_jiffies += 500;
  MachineLoad quiet = machine_load_between(a, b, 4);
  EXPECT_TRUE(quiet.measured);
  EXPECT_NEAR(quiet.other_share, 0.02, 1e-12);
  EXPECT_FALSE(quiet.busy);
  EXPECT_EQ(machine_load_warning(quiet), "");
  // Other processes took 30% of the CPU time.
  b.busy_jiffies += 280;
  MachineLoad others = machine_load_between(a, b, 4);
  EXPECT_NEAR(others.other_share, 0.3, 1e-12);
  EXPECT_TRUE(others.busy);
  // A load at the start above the usable CPUs minus 0.5, with nothing else during the run.
  b = start;
  b.total_jiffies += 1000;
  a.load1 = 3.6;
  EXPECT_TRUE(machine_load_between(a, b, 4).busy);
  a.load1 = 3.4;
  EXPECT_FALSE(machine_load_between(a, b, 4).busy);
  EXPECT_FALSE(machine_load_between(MachineLoadSample{}, b, 4).measured);
}

// A faked busy reading (through $FT_MACHINE_LOAD_DIR) prints the warning above the table and
// puts machine_load into the JSON.
TEST(BenchMachineLoad, FakedBusyMachineWarnsAndGoesIntoTheJson) {
  const std::string dir = ::testing::TempDir() + "/fake_proc";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  write_fake_proc(dir, 7.5, "100 0 50 800 50 0 0 0", 40, 10);
  ASSERT_EQ(setenv("FT_MACHINE_LOAD_DIR", dir.c_str(), 1), 0);
  const MachineLoadWatch watch;
  write_fake_proc(dir, 8.25, "600 0 50 1300 50 0 0 0", 140, 10);  // others: 400 of 1000
  const MachineLoad load = watch.finish();
  unsetenv("FT_MACHINE_LOAD_DIR");
  ASSERT_TRUE(load.measured);
  EXPECT_TRUE(load.busy);
  EXPECT_DOUBLE_EQ(load.load_start, 7.5);
  EXPECT_DOUBLE_EQ(load.load_end, 8.25);
  EXPECT_NEAR(load.other_share, 0.4, 1e-12);
  const std::string warning = machine_load_warning(load);
  EXPECT_EQ(warning.find("warning: machine busy: load average 7.50 at start, 8.25 at end on " +
                         std::to_string(load.cpus) +
                         " CPUs; other processes used 40% of the CPUs: spreads widen, compare "
                         "only within this run"),
            0u)
      << warning;
  BenchRunInfo info;
  info.machine_load = load;
  const std::vector<BenchVariantResult> results = {result_with("unfused", {10, 10, 10}, 3.0)};
  const nlohmann::json json =
      nlohmann::json::parse(bench_to_json(info, results, summarize_bench(results)));
  ASSERT_TRUE(json.contains("machine_load")) << json.dump(1);
  EXPECT_TRUE(json["machine_load"]["busy"].get<bool>());
  EXPECT_DOUBLE_EQ(json["machine_load"]["load_average_start"].get<double>(), 7.5);
  EXPECT_DOUBLE_EQ(json["machine_load"]["other_cpu_share"].get<double>(), 0.4);
}

// fp32 against bf16: a few percent apart is the precision, not a bug; beyond 5e-2 it is one.
TEST(BenchStats, AnotherPrecisionGetsTheLooserLossTolerance) {
  std::vector<BenchVariantResult> results = {result_with("fp32", {10, 10, 10, 10, 10}, 3.0),
                                             result_with("bf16", {7, 7, 7, 7, 7}, 3.0 * 1.03),
                                             result_with("far", {7, 7, 7, 7, 7}, 3.0 * 1.08),
                                             result_with("same", {9, 9, 9, 9, 9}, 3.0 * 1.03)};
  results[1].precision = results[2].precision = "bf16";
  const std::vector<BenchSummary> summaries = summarize_bench(results);
  EXPECT_DOUBLE_EQ(summaries[1].loss_tolerance, kBenchCrossPrecisionLossTolerance);
  EXPECT_TRUE(summaries[1].loss_ok);
  EXPECT_FALSE(summaries[2].loss_ok);
  EXPECT_FALSE(summaries[3].loss_ok) << "same precision keeps the 1e-3 tolerance";
  const std::string table = bench_table_markdown(results, summaries);
  EXPECT_NE(table.find("(relative 5e-02 for variants of another train.precision"),
            std::string::npos)
      << table;
}

// Too few rounds warn; on 1 rank the comm-only variants say they run their counterpart's step.
TEST(BenchStats, FewRoundsWarnAndCommOnlyVariantsAreMarkedOnOneRank) {
  EXPECT_EQ(bench_rounds_warning(kBenchMinRounds), "");
  EXPECT_NE(bench_rounds_warning(2).find("warning: only 2 timed round(s) (--steps 2)"),
            std::string::npos);
  const std::vector<BenchVariant> variants = expand_bench_variants(kDefaultBenchVariants, true);
  std::vector<BenchVariantResult> results;
  for (const BenchVariant& variant : variants) {
    results.push_back(result_with(variant.name, {10, 10, 10}, 3.0));
    results.back().variant = variant;
  }
  std::vector<BenchSummary> summaries = summarize_bench(results);
  note_single_rank_comm_variants(results, 2, &summaries);  // 2 ranks communicate: no notes
  for (const BenchSummary& s : summaries) EXPECT_EQ(s.note, "") << s.name;
  note_single_rank_comm_variants(results, 1, &summaries);
  const std::set<std::string> comm_only = {"bucketing", "overlap", "all-bucketing", "all-overlap"};
  for (const BenchSummary& s : summaries)
    EXPECT_EQ(s.note, comm_only.count(s.name) ? "no communication on 1 rank" : "") << s.name;
  EXPECT_NE(bench_table_markdown(results, summaries)
                .find("| overlap | 10.00 | 10.00 | 10.00 | "
                      "1.000x (1.000-1.000) within noise, no "
                      "communication on 1 rank |"),
            std::string::npos);
  EXPECT_TRUE(bench_comm_only_variant({"b=1", {"comm.bucket_mb=1"}}));  // a --sweep value
  EXPECT_FALSE(bench_comm_only_variant({"x", {"comm.bucket_mb=1", "fusion.max_ops=2"}}));
}

TEST(BenchLaunches, PerStepCountsInTheTableAndJson) {
  EXPECT_EQ(format_launches_per_step(std::nullopt, 3), "-");
  LaunchCounts counted;
  counted.kernels = 1950;
  counted.gemms = 360;
  counted.copies = 126;
  EXPECT_EQ(format_launches_per_step(counted, 3), "812 (k 650, gemm 120, conv 0, copy 42)");
  LaunchCounts uneven;
  uneven.kernels = 5;
  uneven.convolutions = 2;
  EXPECT_EQ(format_launches_per_step(uneven, 2), "3.5 (k 2.5, gemm 0, conv 1, copy 0)");
  // A CUDA-graph replay: one graph launch per step, and the host-issued staging copies.
  LaunchCounts replayed;
  replayed.graphs = 3;
  replayed.copies = 18;
  EXPECT_EQ(format_launches_per_step(replayed, 3), "7 (k 0, gemm 0, conv 0, copy 6, graph 1)");

  // A cuda variant shows its counts per round; a cpu one (nothing counted) shows "-" and null.
  std::vector<BenchVariantResult> results = {result_with("cpu", {10, 10, 10}, 3.0),
                                             result_with("cuda", {5, 5, 5}, 3.0)};
  results[1].launches = counted;
  const std::vector<BenchSummary> summaries = summarize_bench(results);
  const std::string table = bench_table_markdown(results, summaries);
  EXPECT_NE(table.find("| ops | launches/step | allreduces |"), std::string::npos) << table;
  EXPECT_NE(table.find(" | - | "), std::string::npos) << table;
  EXPECT_NE(table.find(" | 812 (k 650, gemm 120, conv 0, copy 42) | "), std::string::npos) << table;
  const nlohmann::json json = nlohmann::json::parse(bench_to_json({}, results, summaries));
  EXPECT_TRUE(json["variants"][0]["launches"].is_null());
  const nlohmann::json& launches = json["variants"][1]["launches"];
  EXPECT_DOUBLE_EQ(launches["kernels"].get<double>(), 650.0);
  EXPECT_DOUBLE_EQ(launches["gemms"].get<double>(), 120.0);
  EXPECT_DOUBLE_EQ(launches["convolutions"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(launches["copies"].get<double>(), 42.0);
}

// Throughput at each variant's median step: items over all ranks per second, one rank's model
// FLOPs per second, and MFU only when a peak is given.
TEST(BenchThroughput, MedianStepRatesAndMfuAgainstTheGivenPeak) {
  std::vector<BenchVariantResult> results = {result_with("unfused", {20, 20, 20}, 3.0),
                                             result_with("all", {10, 10, 10}, 3.0)};
  for (BenchVariantResult& result : results) {
    result.items_per_step = 512;  // tokens over all ranks
    result.item_unit = "tokens";
    result.model_flops_per_rank = 2e9;
  }
  const std::vector<BenchSummary> summaries = summarize_bench(results);
  const std::string plain = bench_throughput_text(results, summaries, 0);
  EXPECT_NE(plain.find("unfused: 25.6k tokens/s, 0.1 model TFLOP/s per rank\n"), std::string::npos)
      << plain;
  EXPECT_NE(plain.find("all: 51.2k tokens/s, 0.2 model TFLOP/s per rank\n"), std::string::npos)
      << plain;
  EXPECT_EQ(plain.find("MFU"), std::string::npos) << plain;
  const std::string with_peak = bench_throughput_text(results, summaries, 0.8);
  EXPECT_NE(with_peak.find("all: 51.2k tokens/s, 0.2 model TFLOP/s per rank (MFU 25.0% of 0.8 "
                           "TFLOP/s)"),
            std::string::npos)
      << with_peak;
  BenchRunInfo info;
  info.peak_tflops = 0.8;
  const nlohmann::json json = nlohmann::json::parse(bench_to_json(info, results, summaries));
  const nlohmann::json& all = json["variants"][1]["throughput"];
  EXPECT_EQ(all["unit"], "tokens");
  EXPECT_DOUBLE_EQ(all["items_per_s"].get<double>(), 51200.0);
  EXPECT_DOUBLE_EQ(all["model_tflops_per_rank"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(all["mfu"].get<double>(), 0.25);
  const nlohmann::json no_peak = nlohmann::json::parse(bench_to_json({}, results, summaries));
  EXPECT_TRUE(no_peak["variants"][1]["throughput"]["mfu"].is_null());
  EXPECT_TRUE(no_peak["variants"][1]["gemm_ms"].is_null()) << "no GEMM timings, no figure";
}

// The cpu step's GEMM share: where fusion cannot act, and so what it can gain at most.
TEST(BenchThroughput, GemmShareOfTheMedianComputeStep) {
  std::vector<BenchVariantResult> results = {result_with("unfused", {20, 20, 20}, 3.0),
                                             result_with("bf16", {10, 10, 10}, 3.0)};
  results[0].gemm_ms = {18, 17, 18};
  results[1].gemm_ms = {6, 6, 7};
  const std::vector<BenchSummary> summaries = summarize_bench(results);
  const std::string text = bench_throughput_text(results, summaries, 0);
  EXPECT_NE(text.find("GEMMs 18.0 ms (90% of compute, 10% outside)"), std::string::npos) << text;
  EXPECT_NE(text.find("GEMMs 6.0 ms (60% of compute, 40% outside)"), std::string::npos) << text;
  const nlohmann::json json = nlohmann::json::parse(bench_to_json({}, results, summaries));
  EXPECT_DOUBLE_EQ(json["variants"][1]["gemm_ms"].get<double>(), 6.0);
}

// Convolutions count as matrix work beside the GEMMs (the ResNet's step is mostly convolutions).
TEST(BenchThroughput, ConvolutionsJoinTheGemmShare) {
  std::vector<BenchVariantResult> results = {result_with("auto", {20, 20, 20}, 3.0)};
  results[0].gemm_ms = {1, 1, 1};
  results[0].conv_ms = {14, 15, 15};
  const std::vector<BenchSummary> summaries = summarize_bench(results);
  const std::string text = bench_throughput_text(results, summaries, 0);
  EXPECT_NE(text.find("GEMMs 1.0 ms, convolutions 15.0 ms (80% of compute, 20% outside)"),
            std::string::npos)
      << text;
  const nlohmann::json json = nlohmann::json::parse(bench_to_json({}, results, summaries));
  EXPECT_DOUBLE_EQ(json["variants"][0]["conv_ms"].get<double>(), 15.0);
}

}  // namespace
}  // namespace ft
