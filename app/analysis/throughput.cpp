#include "app/analysis/throughput.h"

#include <cstdio>

#include "core/check.h"

namespace ft {

StepThroughput step_throughput(double items_per_step, double model_flops_per_rank, double step_ms,
                               double peak_tflops) {
  FT_CHECK(step_ms > 0, "step_throughput: step time ", step_ms, " ms");
  StepThroughput throughput;
  const double seconds = step_ms / 1e3;
  throughput.items_per_s = items_per_step / seconds;
  throughput.model_tflops_per_rank = model_flops_per_rank / seconds / 1e12;
  if (peak_tflops > 0) throughput.mfu = throughput.model_tflops_per_rank / peak_tflops;
  return throughput;
}

std::string human_rate(double per_second) {
  char text[32];
  if (per_second >= 1e6)
    std::snprintf(text, sizeof(text), "%.2fM", per_second / 1e6);
  else if (per_second >= 1e3)
    std::snprintf(text, sizeof(text), "%.1fk", per_second / 1e3);
  else
    std::snprintf(text, sizeof(text), "%.0f", per_second);
  return text;
}

std::string format_throughput(const StepThroughput& throughput, const std::string& unit,
                              double peak_tflops) {
  char text[160];
  std::snprintf(text, sizeof(text), "%s %s/s, %.3g model TFLOP/s per rank",
                human_rate(throughput.items_per_s).c_str(), unit.c_str(),
                throughput.model_tflops_per_rank);
  std::string line = text;
  if (throughput.mfu) {
    std::snprintf(text, sizeof(text), " (MFU %.1f%% of %g TFLOP/s)", 100.0 * *throughput.mfu,
                  peak_tflops);
    line += text;
  }
  return line;
}

}  // namespace ft
