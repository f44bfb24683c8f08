// Train-step speed with every compute fusion off (the eager graph) against every fusion on, for
// gpt_tiny (B=4, T=64), gpt_small and resnet8, interleaved in one process: round r times one
// unfused step, then one fused step, so the machine's drift hits both alike. Prints, per model,
// the median step with p10-p90, the GEMM (and convolution) time inside it, the share outside
// GEMMs, and the speedup as the median of per-round ratios with its p10-p90.
//   build/bench/fusion_step_bench [--rounds N] [--profile] [--fused-set k=v]... [--only MODEL]
// --profile adds each op kind's forward and backward ms per step; --fused-set k=v (repeatable)
// adds a config override to the fused variant only, e.g. to time one pass off (an ablation).
// Env FT_THREADS sets threads (default 1).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "app/training/trainer.h"
#include "core/gemm.h"
#include "core/timer.h"

namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

struct Model {
  const char* name;
  const char* config;
  std::vector<std::string> overrides;
  int rounds;
};

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const double index = p * static_cast<double>(values.size() - 1);
  const size_t low = static_cast<size_t>(index);
  const size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (index - static_cast<double>(low));
}

struct Samples {
  std::vector<double> step_ms, gemm_ms;
  std::map<std::string, double> op_ms;  // per "kind.forward" / "kind.backward", summed
};

// One timed step; GEMM time from core/gemm.h's timer, convolution time from the executor's
// per-op profile (oneDNN and Winograd convolutions do not go through gemm()).
void timed_step(ft::Trainer& trainer, Samples& samples) {
  ft::TimeTable& times = trainer.executor().op_times();
  times.clear();
  const double gemm_before = ft::gemm_timed_ms();
  const double start = ft::now_ms();
  trainer.train_step();
  samples.step_ms.push_back(ft::now_ms() - start);
  double conv_ms = 0;
  for (const auto& [name, entry] : times.entries()) {
    if (name.rfind("conv2d.", 0) == 0 || name.rfind("conv_shortcut.", 0) == 0)
      conv_ms += entry.total_ms;
    samples.op_ms[name] += entry.total_ms;
  }
  samples.gemm_ms.push_back(ft::gemm_timed_ms() - gemm_before + conv_ms);
}

void print_row(const char* model, const char* variant, size_t ops, const Samples& samples) {
  const double median = percentile(samples.step_ms, 0.5);
  const double gemm = percentile(samples.gemm_ms, 0.5);
  std::printf("| %-9s | %-7s | %4zu | %8.2f | %6.2f-%-6.2f | %8.2f | %5.1f%% |\n", model, variant,
              ops, median, percentile(samples.step_ms, 0.1), percentile(samples.step_ms, 0.9), gemm,
              100.0 * (1.0 - gemm / median));
}

std::vector<std::string> fused_extra;  // --fused-set overrides

void compare(const Model& model, int rounds, bool profile) {
  std::vector<std::string> common = model.overrides;
  const char* threads = std::getenv("FT_THREADS");
  common.push_back(std::string("train.threads=") + (threads ? threads : "1"));
  common.push_back("train.steps=100000");
  std::vector<std::string> unfused_overrides = common, fused_overrides = common;
  unfused_overrides.push_back("fusion.enabled=false");
  fused_overrides.push_back("fusion.enabled=true");
  fused_overrides.insert(fused_overrides.end(), fused_extra.begin(), fused_extra.end());
  const ft::Config unfused_config = ft::load_config(source_path(model.config), unfused_overrides);
  const ft::Config fused_config = ft::load_config(source_path(model.config), fused_overrides);
  omp_set_num_threads(unfused_config.train.threads);
  ft::Trainer unfused(unfused_config, nullptr), fused(fused_config, nullptr);
  unfused.executor().set_profiling(true);
  fused.executor().set_profiling(true);
  for (int i = 0; i < 3; ++i) {  // warm the primitive and allocator caches
    unfused.train_step();
    fused.train_step();
  }
  Samples unfused_samples, fused_samples;
  std::vector<double> ratios;
  for (int round = 0; round < rounds; ++round) {
    timed_step(unfused, unfused_samples);
    timed_step(fused, fused_samples);
    ratios.push_back(unfused_samples.step_ms.back() / fused_samples.step_ms.back());
  }
  print_row(model.name, "unfused", unfused.executor().graph().ops.size(), unfused_samples);
  print_row(model.name, "fused", fused.executor().graph().ops.size(), fused_samples);
  if (profile) {
    for (const Samples* samples : {&unfused_samples, &fused_samples}) {
      std::printf("|   %s per-op ms per step:", samples == &unfused_samples ? "unfused" : "fused");
      for (const auto& [name, total] : samples->op_ms)
        std::printf(" %s %.2f", name.c_str(), total / rounds);
      std::printf(" |\n");
    }
  }
  const double low = percentile(ratios, 0.1), high = percentile(ratios, 0.9);
  std::printf("| %-9s | speedup %.3fx (p10-p90 of %d per-round ratios %.3f-%.3f)%s |\n", model.name,
              percentile(ratios, 0.5), rounds, low, high,
              low <= 1.0 && high >= 1.0 ? ", within noise" : "");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds_override = 0;
  bool profile = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds_override = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--fused-set") == 0 && i + 1 < argc) {
      fused_extra.push_back(argv[++i]);
    } else if (std::strcmp(argv[i], "--profile") == 0) {
      profile = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--rounds N] [--profile] [--fused-set k=v]... [--only MODEL]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string text = "data.path=" + source_path("data/moby_dick.txt");
  const std::vector<Model> models = {
      {"gpt_tiny", "configs/gpt_tiny.yaml", {"train.batch_size=4", text}, 60},
      {"gpt_small", "configs/gpt_small.yaml", {text}, 12},
      {"resnet8", "configs/resnet8.yaml", {"train.batch_size=64"}, 20},
  };
  ft::set_gemm_timing(true);
  std::printf("| model     | variant | ops  | median ms | p10-p90 ms | GEMM+conv ms | outside |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Model& model : models)
    if (only.empty() || only == model.name)
      compare(model, rounds_override > 0 ? rounds_override : model.rounds, profile);
  return 0;
}
