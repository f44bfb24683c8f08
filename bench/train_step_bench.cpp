// Training-step benchmarks: one optimizer step (forward, backward, AdamW/SGD) of each model on one
// rank, the figure the README compares against PyTorch and llm.c.
//   build/bench/train_step_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets threads per rank (default 1, as the PyTorch reference was measured).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdlib>
#include <string>

#include "app/training/trainer.h"

namespace {

std::string source_path(const std::string& relative) {
  return std::string(FT_SOURCE_DIR) + "/" + relative;
}

void run_steps(benchmark::State& state, const std::string& config_file,
               std::vector<std::string> overrides, double items_per_step, const char* unit) {
  const char* threads = std::getenv("FT_THREADS");
  overrides.push_back(std::string("train.threads=") + (threads ? threads : "1"));
  overrides.push_back("train.steps=100000");
  const ft::Config config = ft::load_config(source_path(config_file), overrides);
  omp_set_num_threads(config.train.threads);
  ft::Trainer trainer(config, nullptr);
  for (int i = 0; i < 3; ++i) trainer.train_step();  // warm the primitive and allocator caches
  for (auto _ : state) trainer.train_step();
  state.counters[std::string(unit) + "/s"] =
      benchmark::Counter(items_per_step * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_GptTinyStep_B4_T64(benchmark::State& state) {
  run_steps(state, "configs/gpt_tiny.yaml",
            {"train.batch_size=4", "data.path=" + source_path("data/moby_dick.txt")}, 4 * 64,
            "tokens");
}
BENCHMARK(BM_GptTinyStep_B4_T64)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3);

void BM_Resnet8Step_B64(benchmark::State& state) {
  run_steps(state, "configs/resnet8.yaml", {"train.batch_size=64"}, 64, "images");
}
BENCHMARK(BM_Resnet8Step_B64)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3);

void BM_Resnet20Step_B64(benchmark::State& state) {
  run_steps(state, "configs/resnet20.yaml", {"train.batch_size=64"}, 64, "images");
}
BENCHMARK(BM_Resnet20Step_B64)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3);

// The same steps with oneDNN for every convolution (no Winograd), the configuration measured
// before the Winograd kernels existed.
void BM_Resnet8Step_B64_OneDnn(benchmark::State& state) {
  run_steps(state, "configs/resnet8.yaml", {"train.batch_size=64", "model.conv_algorithm=onednn"},
            64, "images");
}
BENCHMARK(BM_Resnet8Step_B64_OneDnn)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3);

void BM_Resnet20Step_B64_OneDnn(benchmark::State& state) {
  run_steps(state, "configs/resnet20.yaml", {"train.batch_size=64", "model.conv_algorithm=onednn"},
            64, "images");
}
BENCHMARK(BM_Resnet20Step_B64_OneDnn)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3);

}  // namespace

BENCHMARK_MAIN();
