#include "app/analysis/tune.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "app/analysis/bench.h"

namespace ft {

TuneMeasureSize plan_tune_measure(int steps_left, int variant_runs) {
  TuneMeasureSize size;
  const int per_variant = variant_runs > 0 ? steps_left / variant_runs : steps_left;
  if (per_variant <= size.steps_per_variant()) return size;
  size.warmup = std::max(1, per_variant / 5);
  size.rounds = per_variant - size.warmup;
  return size;
}

std::vector<double> tune_bucket_values() {
  std::vector<double> values;
  for (double mb = 0.25; mb <= 64.0; mb *= 2) values.push_back(mb);
  return values;
}

std::vector<double> tune_coarse_bucket_values() {
  const std::vector<double> all = tune_bucket_values();
  std::vector<double> values;
  for (size_t i = 0; i < all.size(); i += 2) values.push_back(all[i]);
  return values;
}

std::vector<double> tune_fine_bucket_values(double best) {
  const std::vector<double> all = tune_bucket_values();
  std::vector<double> values;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] != best) continue;
    if (i > 0) values.push_back(all[i - 1]);
    if (i + 1 < all.size()) values.push_back(all[i + 1]);
  }
  return values;
}

std::vector<int> tune_max_ops_values() {
  return {2, 3, 4, 6, 8};
}

std::vector<int> tune_tile_kb_values(int current) {
  std::vector<int> values;
  for (int64_t candidate : {static_cast<int64_t>(current) / 4, static_cast<int64_t>(current) * 4}) {
    const int clamped = static_cast<int>(std::clamp<int64_t>(candidate, 4, 65536));
    if (clamped != current && std::find(values.begin(), values.end(), clamped) == values.end())
      values.push_back(clamped);
  }
  return values;
}

std::vector<std::string> tune_fusion_overrides(const std::vector<std::string>& on,
                                               const PassRegistry& passes) {
  std::vector<std::string> overrides = {"fusion.enabled=true"};
  for (const std::string& key : bench_ablation_keys(passes)) {
    const bool wanted = std::find(on.begin(), on.end(), key) != on.end();
    overrides.push_back(key + (wanted ? "=true" : "=false"));
  }
  return overrides;
}

bool tune_faster_beyond_noise(const TuneMeasurement& measurement) {
  BenchVariantResult baseline, candidate;
  baseline.variant.name = "baseline";
  baseline.step_ms = measurement.baseline_ms;
  candidate.variant.name = "candidate";
  candidate.step_ms = measurement.candidate_ms;
  return summarize_bench({baseline, candidate})[1].speedup_low > 1.0;
}

bool tune_keeps_change(const TuneMeasurement& first, const std::optional<TuneMeasurement>& second) {
  return second.has_value() && tune_faster_beyond_noise(first) && tune_faster_beyond_noise(*second);
}

std::vector<std::string> tune_unique_overrides(const std::vector<std::string>& overrides) {
  std::vector<std::string> unique;
  std::map<std::string, size_t> index;  // key -> position in `unique`
  for (const std::string& text : overrides) {
    const std::string key = text.substr(0, text.find('='));
    const auto [it, inserted] = index.emplace(key, unique.size());
    if (inserted)
      unique.push_back(text);
    else
      unique[it->second] = text;
  }
  return unique;
}

std::string format_tune_report(const TuneReport& report) {
  const std::string busy = machine_load_warning(report.machine_load);
  std::string text = busy.empty() ? "" : busy + "\n";
  text +=
      "| stage | point | median ms | p10 ms | p90 ms | vs | speedup (p10-p90) | kept |\n"
      "|---|---|---:|---:|---:|---|---|---|\n";
  char line[512];
  for (const TunePoint& p : report.points) {
    char speedup[96] = "-";
    if (!p.against.empty())
      std::snprintf(speedup, sizeof(speedup), "%.3fx (%.3f-%.3f)%s", p.speedup, p.speedup_p10,
                    p.speedup_p90, p.within_noise ? " within noise" : "");
    std::snprintf(line, sizeof(line), "| %s | %s | %.2f | %.2f | %.2f | %s | %s | %s |\n",
                  p.stage.c_str(), p.name.c_str(), p.median_ms, p.p10_ms, p.p90_ms,
                  p.against.empty() ? "-" : p.against.c_str(), speedup, p.kept ? "yes" : "");
    text += line;
  }
  text += "\nrecommended by the profile:";
  for (const std::string& key : report.recommended_keys) text += " " + key;
  if (report.recommended_keys.empty()) text += " nothing";
  text += "\n";
  for (const std::string& note : report.notes) text += "note: " + note + "\n";
  std::snprintf(line, sizeof(line), "winner: %.2f ms/step with", report.winner_median_ms);
  text += line;
  for (const std::string& o : tune_unique_overrides(report.winner_overrides)) text += " " + o;
  std::snprintf(line, sizeof(line), "\nsteps used: %d of a budget of %d; config written to %s\n",
                report.steps_used, report.budget_steps, report.yaml_path.c_str());
  text += line;
  return text;
}

nlohmann::json tune_json(const TuneReport& report) {
  nlohmann::json points = nlohmann::json::array();
  for (const TunePoint& p : report.points)
    points.push_back({{"stage", p.stage},
                      {"name", p.name},
                      {"overrides", p.overrides},
                      {"median_ms", p.median_ms},
                      {"p10_ms", p.p10_ms},
                      {"p90_ms", p.p90_ms},
                      {"against", p.against},
                      {"speedup", p.speedup},
                      {"speedup_p10", p.speedup_p10},
                      {"speedup_p90", p.speedup_p90},
                      {"within_noise", p.within_noise},
                      {"kept", p.kept},
                      {"confirmation", p.confirmation}});
  nlohmann::json root = {{"config", report.config_path},
                         {"world_size", report.world_size},
                         {"budget_steps", report.budget_steps},
                         {"steps_used", report.steps_used},
                         {"recommended_keys", report.recommended_keys},
                         {"points", points},
                         {"notes", report.notes},
                         {"winner",
                          {{"overrides", tune_unique_overrides(report.winner_overrides)},
                           {"median_ms", report.winner_median_ms}}},
                         {"yaml", report.yaml_path}};
  if (report.machine_load.measured) root["machine_load"] = machine_load_json(report.machine_load);
  return root;
}

}  // namespace ft
