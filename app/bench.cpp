#include "app/bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "app/throughput.h"
#include "core/check.h"

namespace ft {
namespace {

const char* const kVerticalPasses[] = {"gemm_epilogue", "residual_layernorm", "classifier",
                                       "attention", "bn_relu"};
const char* const kHorizontalPasses[] = {"qkv", "batched_layernorm", "multi_tensor",
                                         "conv_shortcut"};

const std::vector<std::string> kNoComm = {"comm.bucketing=false", "comm.overlap=false"};

std::vector<std::string> concat(std::vector<std::string> first,
                                const std::vector<std::string>& second) {
  first.insert(first.end(), second.begin(), second.end());
  return first;
}

std::vector<std::string> family_off(const char* family) {
  std::vector<std::string> overrides;
  const bool vertical = std::string(family) == "vertical";
  if (vertical)
    for (const char* pass : kVerticalPasses)
      overrides.push_back(std::string("fusion.vertical.") + pass + "=false");
  else
    for (const char* pass : kHorizontalPasses)
      overrides.push_back(std::string("fusion.horizontal.") + pass + "=false");
  return overrides;
}

const std::vector<std::string> kAll = {"fusion.enabled=true", "comm.bucketing=true",
                                       "comm.overlap=true", "fusion.cuda_graph=false"};

// A family's passes stay as the config sets them (a preset may switch one off for speed); the
// other family is switched off.
bool named_variant(const std::string& name, BenchVariant* variant) {
  variant->name = name;
  if (name == "unfused")
    variant->overrides = concat({"fusion.enabled=false"}, kNoComm);
  else if (name == "horizontal")
    variant->overrides = concat(concat({"fusion.enabled=true"}, kNoComm), family_off("vertical"));
  else if (name == "vertical")
    variant->overrides = concat(concat({"fusion.enabled=true"}, kNoComm), family_off("horizontal"));
  else if (name == "bucketing")
    variant->overrides = {"fusion.enabled=false", "comm.bucketing=true", "comm.overlap=false"};
  else if (name == "overlap")  // overlap launches buckets during backward: it needs bucketing
    variant->overrides = {"fusion.enabled=false", "comm.bucketing=true", "comm.overlap=true"};
  else if (name == "all")
    variant->overrides = kAll;
  else if (name == "cuda_graph")  // all, with the whole step replayed as one CUDA graph
    variant->overrides = concat(kAll, {"fusion.cuda_graph=true"});
  else if (name == "all-bucketing")  // per-tensor allreduces, still overlapped
    variant->overrides = concat(kAll, {"comm.bucketing=false"});
  else if (name == "all-overlap")
    variant->overrides = concat(kAll, {"comm.overlap=false"});
  else if (name.rfind("all-", 0) == 0) {
    const std::string pass = name.substr(4);
    for (const std::string& key : bench_ablation_keys()) {
      if (key.substr(key.rfind('.') + 1) != pass) continue;
      variant->overrides = concat(kAll, {key + "=false"});
      return true;
    }
    return false;
  } else
    return false;
  return true;
}

std::string joined(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

// "name:key=value;key=value"
BenchVariant ad_hoc_variant(const std::string& entry) {
  const size_t colon = entry.find(':');
  BenchVariant variant;
  variant.name = entry.substr(0, colon);
  if (variant.name.empty())
    FT_FAIL("--variants '", entry,
            "': an ad-hoc variant needs a name before ':' (name:key=value;key=value)");
  for (const std::string& override_text : split(entry.substr(colon + 1), ';')) {
    if (override_text.empty()) continue;
    const size_t equals = override_text.find('=');
    if (equals == std::string::npos || equals == 0)
      FT_FAIL("--variants '", entry, "': override '", override_text,
              "' is not key=value (name:key=value;key=value)");
    variant.overrides.push_back(override_text);
  }
  if (variant.overrides.empty())
    FT_FAIL("--variants '", entry, "': an ad-hoc variant needs at least one key=value after ':'");
  return variant;
}

std::string mib(double bytes) {
  static const char* const kSuffixes[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int suffix = 0;
  while (bytes >= 1023.5 && suffix < 4) {
    bytes /= 1024.0;
    ++suffix;
  }
  char text[32];
  const char* format = suffix == 0 || bytes >= 100 ? "%.0f%s" : bytes >= 10 ? "%.1f%s" : "%.2f%s";
  std::snprintf(text, sizeof(text), format, bytes, kSuffixes[suffix]);
  return text;
}

double median(const std::vector<double>& values) {
  return values.empty() ? 0.0 : bench_percentile(values, 0.5);
}

double per_step(int64_t total, size_t rounds) {
  return static_cast<double>(total) / static_cast<double>(std::max<size_t>(rounds, 1));
}

std::string per_step_text(int64_t total, size_t rounds) {
  const double value = per_step(total, rounds);
  char text[32];
  std::snprintf(text, sizeof(text), value == std::floor(value) ? "%.0f" : "%.1f", value);
  return text;
}

StepThroughput median_throughput(const BenchVariantResult& result, const BenchSummary& summary,
                                 double peak_tflops) {
  return step_throughput(result.items_per_step, result.model_flops_per_rank,
                         std::max(summary.median_ms, 1e-9), peak_tflops);
}

nlohmann::json throughput_json(const BenchVariantResult& result, const BenchSummary& summary,
                               double peak_tflops) {
  const StepThroughput throughput = median_throughput(result, summary, peak_tflops);
  return {{"unit", result.item_unit},
          {"items_per_s", throughput.items_per_s},
          {"model_flops_per_rank_step", result.model_flops_per_rank},
          {"model_tflops_per_rank", throughput.model_tflops_per_rank},
          {"peak_tflops", peak_tflops > 0 ? nlohmann::json(peak_tflops) : nlohmann::json()},
          {"mfu", throughput.mfu ? nlohmann::json(*throughput.mfu) : nlohmann::json()}};
}

// {kernels, gemms, convolutions, copies, graphs} per step; null when nothing was counted (cpu).
nlohmann::json launches_json(const std::optional<LaunchCounts>& launches, size_t rounds) {
  if (!launches) return nullptr;
  return {{"kernels", per_step(launches->kernels, rounds)},
          {"gemms", per_step(launches->gemms, rounds)},
          {"convolutions", per_step(launches->convolutions, rounds)},
          {"copies", per_step(launches->copies, rounds)},
          {"graphs", per_step(launches->graphs, rounds)}};
}

}  // namespace

const char* const kDefaultBenchVariants = "unfused,horizontal,vertical,bucketing,overlap,all";

std::string format_launches_per_step(const std::optional<LaunchCounts>& launches, size_t rounds) {
  if (!launches) return "-";
  return per_step_text(launches->total(), rounds) + " (k " +
         per_step_text(launches->kernels, rounds) + ", gemm " +
         per_step_text(launches->gemms, rounds) + ", conv " +
         per_step_text(launches->convolutions, rounds) + ", copy " +
         per_step_text(launches->copies, rounds) +
         (launches->graphs > 0 ? ", graph " + per_step_text(launches->graphs, rounds) : "") + ")";
}

std::string bench_rounds_warning(int rounds) {
  if (rounds >= kBenchMinRounds) return "";
  return "warning: only " + std::to_string(rounds) + " timed round(s) (--steps " +
         std::to_string(rounds) +
         "): p10-p90 of so few rounds is no noise estimate, so a speedup " +
         "without \"within noise\" may still be noise; use --steps " +
         std::to_string(kBenchMinRounds) + " or more";
}

bool bench_comm_only_variant(const BenchVariant& variant) {
  for (const char* name : {"bucketing", "overlap", "all-bucketing", "all-overlap"})
    if (variant.name == name) return true;
  if (variant.overrides.empty()) return false;
  for (const std::string& override_text : variant.overrides)
    if (override_text.rfind("comm.", 0) != 0) return false;
  return true;
}

void note_single_rank_comm_variants(const std::vector<BenchVariantResult>& results, int world_size,
                                    std::vector<BenchSummary>* summaries) {
  if (world_size != 1) return;
  for (size_t v = 0; v < summaries->size() && v < results.size(); ++v)
    if (!(*summaries)[v].baseline && bench_comm_only_variant(results[v].variant))
      (*summaries)[v].note = "no communication on 1 rank";
}

std::vector<std::string> bench_ablation_keys() {
  std::vector<std::string> keys;
  for (const char* pass : kVerticalPasses) keys.push_back(std::string("fusion.vertical.") + pass);
  for (const char* pass : kHorizontalPasses)
    keys.push_back(std::string("fusion.horizontal.") + pass);
  return keys;
}

std::vector<std::string> bench_variant_names() {
  std::vector<std::string> names = split(kDefaultBenchVariants, ',');
  for (const std::string& key : bench_ablation_keys())
    names.push_back("all-" + key.substr(key.rfind('.') + 1));
  names.push_back("all-bucketing");
  names.push_back("all-overlap");
  names.push_back("cuda_graph");
  return names;
}

std::vector<BenchVariant> expand_bench_variants(const std::string& list, bool ablation) {
  std::vector<BenchVariant> variants;
  for (const std::string& entry : split(list, ',')) {
    if (entry.empty())
      FT_FAIL("--variants '", list, "': empty entry; allowed: ", joined(bench_variant_names()),
              ", or name:key=value;key=value");
    if (entry.find(':') != std::string::npos) {
      variants.push_back(ad_hoc_variant(entry));
      continue;
    }
    BenchVariant variant;
    if (!named_variant(entry, &variant))
      FT_FAIL("--variants: unknown variant '", entry, "'; allowed: ", joined(bench_variant_names()),
              ", or name:key=value;key=value");
    variants.push_back(variant);
  }
  if (ablation) {
    for (const std::string& name : bench_variant_names()) {
      if (name.rfind("all-", 0) != 0) continue;
      BenchVariant variant;
      named_variant(name, &variant);
      variants.push_back(variant);
    }
  }
  std::set<std::string> seen;
  for (const BenchVariant& variant : variants)
    if (!seen.insert(variant.name).second)
      FT_FAIL("--variants: variant '", variant.name, "' appears twice",
              ablation && variant.name.rfind("all-", 0) == 0 ? " (--ablation adds it)" : "");
  return variants;
}

std::vector<BenchVariant> expand_bench_sweep(const std::string& spec) {
  const size_t equals = spec.find('=');
  if (equals == std::string::npos || equals == 0 || equals + 1 == spec.size())
    FT_FAIL("--sweep '", spec, "': expected key=v1,v2,... (e.g. comm.bucket_mb=0.25,1,4)");
  const std::string key = spec.substr(0, equals);
  std::vector<BenchVariant> variants;
  std::set<std::string> seen;
  for (const std::string& value : split(spec.substr(equals + 1), ',')) {
    if (value.empty())
      FT_FAIL("--sweep '", spec, "': empty value; expected key=v1,v2,... (e.g. ", key, "=1,2,4)");
    if (!seen.insert(value).second) FT_FAIL("--sweep '", spec, "': value '", value, "' twice");
    variants.push_back({key + "=" + value, {key + "=" + value}});
  }
  return variants;
}

double bench_percentile(std::vector<double> values, double p) {
  FT_CHECK(!values.empty(), "percentile of no values");
  std::sort(values.begin(), values.end());
  const double index = p * static_cast<double>(values.size() - 1);
  const size_t low = static_cast<size_t>(index);
  const size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (index - static_cast<double>(low));
}

std::vector<BenchSummary> summarize_bench(const std::vector<BenchVariantResult>& results) {
  FT_CHECK(!results.empty(), "no variants to summarize");
  const BenchVariantResult& baseline = results.front();
  std::vector<BenchSummary> summaries;
  for (size_t v = 0; v < results.size(); ++v) {
    const BenchVariantResult& result = results[v];
    FT_CHECK(!result.step_ms.empty() && result.step_ms.size() == baseline.step_ms.size(),
             "variant ", result.variant.name, " has ", result.step_ms.size(), " rounds, baseline ",
             baseline.step_ms.size());
    BenchSummary summary;
    summary.name = result.variant.name;
    summary.baseline = v == 0;
    summary.median_ms = median(result.step_ms);
    summary.p10_ms = bench_percentile(result.step_ms, 0.1);
    summary.p90_ms = bench_percentile(result.step_ms, 0.9);
    // Ratios per round, not of medians: a slow round slows every variant in it alike.
    std::vector<double> ratios;
    for (size_t r = 0; r < result.step_ms.size(); ++r)
      ratios.push_back(baseline.step_ms[r] / std::max(result.step_ms[r], 1e-9));
    summary.speedup = median(ratios);
    summary.speedup_low = bench_percentile(ratios, 0.1);
    summary.speedup_high = bench_percentile(ratios, 0.9);
    summary.within_noise =
        !summary.baseline && summary.speedup_low <= 1.0 && summary.speedup_high >= 1.0;
    summary.compute_ms = median(result.compute_ms);
    summary.comm_ms = median(result.comm_ms);
    summary.exposed_ms = median(result.exposed_ms);
    summary.allreduces_per_step = median(result.allreduce_calls);
    summary.final_loss = result.final_loss;
    const double reference = std::max(std::fabs(baseline.final_loss), 1e-12);
    summary.loss_relative_error = std::fabs(result.final_loss - baseline.final_loss) / reference;
    summary.loss_ok = summary.loss_relative_error <= kBenchLossTolerance;
    summaries.push_back(summary);
  }
  return summaries;
}

std::string bench_throughput_text(const std::vector<BenchVariantResult>& results,
                                  const std::vector<BenchSummary>& summaries, double peak_tflops) {
  std::string text = "throughput at the median step (model FLOPs: the eager graph's):\n";
  for (size_t v = 0; v < summaries.size(); ++v)
    text += "  " + summaries[v].name + ": " +
            format_throughput(median_throughput(results[v], summaries[v], peak_tflops),
                              results[v].item_unit, peak_tflops) +
            "\n";
  return text;
}

std::string bench_table_markdown(const std::vector<BenchVariantResult>& results,
                                 const std::vector<BenchSummary>& summaries) {
  std::string text =
      "| variant | median ms | p10 ms | p90 ms | speedup (p10-p90) | compute ms | comm ms | "
      "exposed ms | ops | launches/step | allreduces | bytes moved | peak act. mem | final loss |\n"
      "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  char line[512];
  for (size_t v = 0; v < summaries.size(); ++v) {
    const BenchSummary& s = summaries[v];
    const BenchVariantResult& result = results[v];
    char speedup[128];
    if (s.baseline)
      std::snprintf(speedup, sizeof(speedup), "1.000 (baseline)");
    else
      std::snprintf(speedup, sizeof(speedup), "%.3fx (%.3f-%.3f)%s%s%s", s.speedup, s.speedup_low,
                    s.speedup_high, s.within_noise ? " within noise" : "",
                    s.note.empty() ? "" : ", ", s.note.c_str());
    char loss[64];
    std::snprintf(loss, sizeof(loss), "%.6f%s", s.final_loss, s.loss_ok ? "" : " LOSS MISMATCH");
    std::snprintf(
        line, sizeof(line),
        "| %s | %.2f | %.2f | %.2f | %s | %.2f | %.2f | %.2f | %zu | %s | %.0f | %s | %s | "
        "%s |\n",
        s.name.c_str(), s.median_ms, s.p10_ms, s.p90_ms, speedup, s.compute_ms, s.comm_ms,
        s.exposed_ms, result.ops_per_step,
        format_launches_per_step(result.launches, result.step_ms.size()).c_str(),
        s.allreduces_per_step, mib(result.bytes_moved).c_str(),
        mib(result.peak_activation_bytes).c_str(), loss);
    text += line;
  }
  std::snprintf(line, sizeof(line),
                "\nspeedup: median over rounds of %s ms / variant ms, with the p10-p90 of those "
                "ratios; final loss tolerance: relative %.0e of %s's\n",
                summaries.front().name.c_str(), kBenchLossTolerance,
                summaries.front().name.c_str());
  text += line;
  return text;
}

std::string bench_to_json(const BenchRunInfo& info, const std::vector<BenchVariantResult>& results,
                          const std::vector<BenchSummary>& summaries) {
  nlohmann::json variants = nlohmann::json::array();
  for (size_t v = 0; v < summaries.size(); ++v) {
    const BenchSummary& s = summaries[v];
    const BenchVariantResult& result = results[v];
    variants.push_back({{"variant", s.name},
                        {"overrides", result.variant.overrides},
                        {"median_ms", s.median_ms},
                        {"p10_ms", s.p10_ms},
                        {"p90_ms", s.p90_ms},
                        {"speedup", s.speedup},
                        {"speedup_p10", s.speedup_low},
                        {"speedup_p90", s.speedup_high},
                        {"within_noise", s.within_noise},
                        {"note", s.note},
                        {"compute_ms", s.compute_ms},
                        {"comm_ms", s.comm_ms},
                        {"exposed_comm_ms", s.exposed_ms},
                        {"ops_per_step", result.ops_per_step},
                        {"launches", launches_json(result.launches, result.step_ms.size())},
                        {"throughput", throughput_json(result, s, info.peak_tflops)},
                        {"allreduces_per_step", s.allreduces_per_step},
                        {"bytes_moved", result.bytes_moved},
                        {"peak_activation_bytes", result.peak_activation_bytes},
                        {"final_loss", s.final_loss},
                        {"loss_relative_error", s.loss_relative_error},
                        {"loss_ok", s.loss_ok},
                        {"step_ms", result.step_ms}});
    if (!result.profile.is_null()) variants.back()["profile"] = result.profile;
  }
  const nlohmann::json root = {
      {"config", info.config_path},
      {"overrides", info.overrides},
      {"world_size", info.world_size},
      {"threads", info.threads},
      {"warmup", info.warmup},
      {"rounds", info.rounds},
      {"baseline", summaries.front().name},
      {"loss_tolerance", {{"relative", kBenchLossTolerance}, {"against", summaries.front().name}}},
      {"order", info.order},
      {"variants", variants}};
  return root.dump(2);
}

}  // namespace ft
