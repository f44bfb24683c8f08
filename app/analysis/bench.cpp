#include "app/analysis/bench.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/check.h"
#include "fusion/pass_registry.h"

namespace ft {
namespace {

const std::vector<std::string> kNoComm = {"comm.bucketing=false", "comm.overlap=false"};

std::vector<std::string> concat(std::vector<std::string> first,
                                const std::vector<std::string>& second) {
  first.insert(first.end(), second.begin(), second.end());
  return first;
}

// Every key of `family` in `passes`, switched off.
std::vector<std::string> family_off(const PassRegistry& passes, PassFamily family) {
  std::vector<std::string> overrides;
  for (const std::string& key : passes.keys(family)) overrides.push_back(key + "=false");
  return overrides;
}

const std::vector<std::string> kAll = {"fusion.enabled=true", "comm.bucketing=true",
                                       "comm.overlap=true", "fusion.cuda_graph=false"};

// A family's passes stay as the config sets them (a preset may switch one off for speed); the
// other family is switched off.
bool named_variant(const std::string& name, const PassRegistry& passes, BenchVariant* variant) {
  variant->name = name;
  if (name == "unfused")
    variant->overrides = concat({"fusion.enabled=false"}, kNoComm);
  else if (name == "horizontal")
    variant->overrides =
        concat(concat({"fusion.enabled=true"}, kNoComm), family_off(passes, PassFamily::kVertical));
  else if (name == "vertical")
    variant->overrides = concat(concat({"fusion.enabled=true"}, kNoComm),
                                family_off(passes, PassFamily::kHorizontal));
  else if (name == "bucketing")
    variant->overrides = {"fusion.enabled=false", "comm.bucketing=true", "comm.overlap=false"};
  else if (name == "overlap")  // overlap launches buckets during backward: it needs bucketing
    variant->overrides = {"fusion.enabled=false", "comm.bucketing=true", "comm.overlap=true"};
  else if (name == "all" || name == "fused") {  // "fused" is another name of all
    variant->name = "all";
    variant->overrides = kAll;
  } else if (name == "fp32" || name == "bf16")  // all, in that train.precision
    variant->overrides = concat(kAll, {"train.precision=" + name});
  else if (name == "cuda_graph")  // all, with the whole step replayed as one CUDA graph
    variant->overrides = concat(kAll, {"fusion.cuda_graph=true"});
  else if (name == "all-bucketing")  // per-tensor allreduces, still overlapped
    variant->overrides = concat(kAll, {"comm.bucketing=false"});
  else if (name == "all-overlap")
    variant->overrides = concat(kAll, {"comm.overlap=false"});
  else if (name.rfind("all-", 0) == 0) {
    const std::string pass = name.substr(4);
    for (const std::string& key : bench_ablation_keys(passes)) {
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
    FT_USAGE_FAIL("--variants '", entry,
                  "': an ad-hoc variant needs a name before ':' (name:key=value;key=value)");
  for (const std::string& override_text : split(entry.substr(colon + 1), ';')) {
    if (override_text.empty()) continue;
    const size_t equals = override_text.find('=');
    if (equals == std::string::npos || equals == 0)
      FT_USAGE_FAIL("--variants '", entry, "': override '", override_text,
                    "' is not key=value (name:key=value;key=value)");
    variant.overrides.push_back(override_text);
  }
  if (variant.overrides.empty())
    FT_USAGE_FAIL("--variants '", entry,
                  "': an ad-hoc variant needs at least one key=value after ':'");
  return variant;
}

double median(const std::vector<double>& values) {
  return values.empty() ? 0.0 : bench_percentile(values, 0.5);
}

}  // namespace

const char* const kDefaultBenchVariants = "unfused,horizontal,vertical,bucketing,overlap,all";

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

std::vector<std::string> bench_ablation_keys(const PassRegistry& passes) {
  return concat(passes.keys(PassFamily::kVertical), passes.keys(PassFamily::kHorizontal));
}

std::vector<std::string> bench_variant_names(const PassRegistry& passes) {
  std::vector<std::string> names = split(kDefaultBenchVariants, ',');
  for (const std::string& key : bench_ablation_keys(passes))
    names.push_back("all-" + key.substr(key.rfind('.') + 1));
  names.push_back("all-bucketing");
  names.push_back("all-overlap");
  names.push_back("fused");
  names.push_back("cuda_graph");
  names.push_back("fp32");
  names.push_back("bf16");
  return names;
}

std::vector<BenchVariant> expand_bench_variants(const std::string& list, bool ablation,
                                                const PassRegistry& passes) {
  std::vector<BenchVariant> variants;
  for (const std::string& entry : split(list, ',')) {
    if (entry.empty())
      FT_USAGE_FAIL("--variants '", list,
                    "': empty entry; allowed: ", joined(bench_variant_names(passes)),
                    ", or name:key=value;key=value");
    if (entry.find(':') != std::string::npos) {
      variants.push_back(ad_hoc_variant(entry));
      continue;
    }
    BenchVariant variant;
    if (!named_variant(entry, passes, &variant))
      FT_USAGE_FAIL("--variants: unknown variant '", entry,
                    "'; allowed: ", joined(bench_variant_names(passes)),
                    ", or name:key=value;key=value");
    variants.push_back(variant);
  }
  if (ablation) {
    for (const std::string& name : bench_variant_names(passes)) {
      if (name.rfind("all-", 0) != 0) continue;
      BenchVariant variant;
      named_variant(name, passes, &variant);
      variants.push_back(variant);
    }
  }
  std::set<std::string> seen;
  for (const BenchVariant& variant : variants)
    if (!seen.insert(variant.name).second)
      FT_USAGE_FAIL("--variants: variant '", variant.name, "' appears twice",
                    ablation && variant.name.rfind("all-", 0) == 0 ? " (--ablation adds it)" : "");
  return variants;
}

std::vector<BenchVariant> expand_bench_sweep(const std::string& spec) {
  const size_t equals = spec.find('=');
  if (equals == std::string::npos || equals == 0 || equals + 1 == spec.size())
    FT_USAGE_FAIL("--sweep '", spec, "': expected key=v1,v2,... (e.g. comm.bucket_mb=0.25,1,4)");
  const std::string key = spec.substr(0, equals);
  std::vector<BenchVariant> variants;
  std::set<std::string> seen;
  for (const std::string& value : split(spec.substr(equals + 1), ',')) {
    if (value.empty())
      FT_USAGE_FAIL("--sweep '", spec, "': empty value; expected key=v1,v2,... (e.g. ", key,
                    "=1,2,4)");
    if (!seen.insert(value).second)
      FT_USAGE_FAIL("--sweep '", spec, "': value '", value, "' twice");
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
    summary.median_ratio = median(baseline.step_ms) / std::max(summary.median_ms, 1e-9);
    summary.within_noise =
        !summary.baseline && summary.speedup_low <= 1.0 && summary.speedup_high >= 1.0;
    summary.compute_ms = median(result.compute_ms);
    if (!result.gemm_ms.empty()) summary.gemm_ms = median(result.gemm_ms);
    if (!result.conv_ms.empty()) summary.conv_ms = median(result.conv_ms);
    summary.comm_ms = median(result.comm_ms);
    summary.exposed_ms = median(result.exposed_ms);
    summary.allreduces_per_step = median(result.allreduce_calls);
    if (!result.bytes_reduced.empty())
      summary.bytes_reduced_per_step = median(result.bytes_reduced);
    summary.final_loss = result.final_loss;
    const double reference = std::max(std::fabs(baseline.final_loss), 1e-12);
    summary.loss_relative_error = std::fabs(result.final_loss - baseline.final_loss) / reference;
    summary.loss_tolerance = result.precision == baseline.precision
                                 ? kBenchLossTolerance
                                 : kBenchCrossPrecisionLossTolerance;
    summary.loss_ok = summary.loss_relative_error <= summary.loss_tolerance;
    summaries.push_back(summary);
  }
  return summaries;
}

}  // namespace ft
