// The reporting half of app/analysis/bench.h: the Markdown table, the throughput lines and the JSON
// of a finished bench run, with the byte and per-step formatting they share. Split from
// app/analysis/bench.cpp, which keeps the variant lists and the statistics.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/analysis/bench.h"
#include "app/analysis/plan.h"
#include "app/analysis/throughput.h"

namespace ft {
namespace {

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

// "-" where nothing was reduced (one rank), so the column does not read as a measured zero.
std::string reduced_text(double bytes) {
  return bytes > 0 ? binary_bytes_text(bytes) : "-";
}

}  // namespace

std::string format_launches_per_step(const std::optional<LaunchCounts>& launches, size_t rounds) {
  if (!launches) return "-";
  return per_step_text(launches->total(), rounds) + " (k " +
         per_step_text(launches->kernels, rounds) + ", gemm " +
         per_step_text(launches->gemms, rounds) + ", conv " +
         per_step_text(launches->convolutions, rounds) + ", copy " +
         per_step_text(launches->copies, rounds) +
         (launches->graphs > 0 ? ", graph " + per_step_text(launches->graphs, rounds) : "") + ")";
}

// ", GEMMs 212.4 ms (83% of compute, 17% outside)": the cpu step's GEMM share, with
// ", convolutions 20.1 ms" before the parenthesis when any ran; "" on cuda.
static std::string gemm_share_text(const BenchSummary& summary) {
  if (summary.gemm_ms < 0 || summary.compute_ms <= 0) return "";
  const double share = (summary.gemm_ms + summary.conv_ms) / summary.compute_ms;
  char convs[64] = "";
  if (summary.conv_ms > 0)
    std::snprintf(convs, sizeof(convs), ", convolutions %.1f ms", summary.conv_ms);
  char text[160];
  std::snprintf(text, sizeof(text), ", GEMMs %.1f ms%s (%.0f%% of compute, %.0f%% outside)",
                summary.gemm_ms, convs, 100 * share, 100 * (1 - share));
  return text;
}

std::string bench_throughput_text(const std::vector<BenchVariantResult>& results,
                                  const std::vector<BenchSummary>& summaries, double peak_tflops) {
  std::string text = "throughput at the median step (model FLOPs: the eager graph's):\n";
  for (size_t v = 0; v < summaries.size(); ++v)
    text += "  " + summaries[v].name + ": " +
            format_throughput(median_throughput(results[v], summaries[v], peak_tflops),
                              results[v].item_unit, peak_tflops) +
            gemm_share_text(summaries[v]) + "\n";
  return text;
}

std::string bench_table_markdown(const std::vector<BenchVariantResult>& results,
                                 const std::vector<BenchSummary>& summaries) {
  std::string text =
      "| variant | median ms | p10 ms | p90 ms | speedup (p10-p90) | median ratio | compute ms | "
      "comm ms | exposed ms | ops | launches/step | allreduces | reduced/step | bytes moved | "
      "peak act. mem | final loss |\n"
      "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
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
        "| %s | %.2f | %.2f | %.2f | %s | %.3fx | %.2f | %.2f | %.2f | %zu | %s | %.0f | %s | %s | "
        "%s | %s |\n",
        s.name.c_str(), s.median_ms, s.p10_ms, s.p90_ms, speedup, s.median_ratio, s.compute_ms,
        s.comm_ms, s.exposed_ms, result.ops_per_step,
        format_launches_per_step(result.launches, result.step_ms.size()).c_str(),
        s.allreduces_per_step, reduced_text(s.bytes_reduced_per_step).c_str(),
        binary_bytes_text(result.bytes_moved).c_str(),
        binary_bytes_text(result.peak_activation_bytes).c_str(), loss);
    text += line;
  }
  std::snprintf(line, sizeof(line),
                "\nspeedup: median over rounds of %s ms / variant ms, with the p10-p90 of those "
                "ratios; median ratio: %s's median ms / the variant's median ms (the two differ "
                "when rounds are noisy); final loss tolerance: relative %.0e of %s's\n",
                summaries.front().name.c_str(), summaries.front().name.c_str(), kBenchLossTolerance,
                summaries.front().name.c_str());
  text += line;
  for (const BenchSummary& s : summaries)
    if (s.loss_tolerance != kBenchLossTolerance) {
      std::snprintf(line, sizeof(line),
                    "(relative %.0e for variants of another train.precision than %s's)\n",
                    kBenchCrossPrecisionLossTolerance, summaries.front().name.c_str());
      text += line;
      break;
    }
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
                        {"median_ratio", s.median_ratio},
                        {"within_noise", s.within_noise},
                        {"note", s.note},
                        {"compute_ms", s.compute_ms},
                        {"gemm_ms", s.gemm_ms < 0 ? nlohmann::json() : nlohmann::json(s.gemm_ms)},
                        {"conv_ms", s.gemm_ms < 0 ? nlohmann::json() : nlohmann::json(s.conv_ms)},
                        {"comm_ms", s.comm_ms},
                        {"exposed_comm_ms", s.exposed_ms},
                        {"ops_per_step", result.ops_per_step},
                        {"launches", launches_json(result.launches, result.step_ms.size())},
                        {"throughput", throughput_json(result, s, info.peak_tflops)},
                        {"allreduces_per_step", s.allreduces_per_step},
                        {"bytes_reduced_per_step", s.bytes_reduced_per_step},
                        {"bytes_moved", result.bytes_moved},
                        {"peak_activation_bytes", result.peak_activation_bytes},
                        {"final_loss", s.final_loss},
                        {"loss_relative_error", s.loss_relative_error},
                        {"loss_tolerance", s.loss_tolerance},
                        {"loss_ok", s.loss_ok},
                        {"step_ms", result.step_ms}});
    if (!result.profile.is_null()) variants.back()["profile"] = result.profile;
  }
  nlohmann::json root = {
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
  if (info.machine_load.measured) root["machine_load"] = machine_load_json(info.machine_load);
  return root.dump(2);
}

}  // namespace ft
