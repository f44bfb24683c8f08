// GPT forward + backward benchmark (no optimizer) at the gpt_tiny shape of the speed
// target (n_layer 4, d_model 128, 4 heads, B=4, T=64) on one rank, with the per-op-kind time of a
// step as counters (ms, executor profiling): where a step's time goes, and so which fusion can
// pay.
//   build/bench/gpt_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1, as train_step_bench).
#include <benchmark/benchmark.h>

#include "bench/profiled_steps.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/gpt.h"

namespace {

void BM_GptForwardBackward(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  const int batch = static_cast<int>(state.range(0));
  ft::GptShape shape;
  shape.n_layer = 4;
  shape.n_head = 4;
  shape.d_model = 128;
  shape.seq_len = 64;
  shape.vocab_size = 256;
  ft::ParamStore params;
  ft::Graph graph = ft::build_gpt(shape, batch, params);
  params.allocate();
  params.initialize(1);
  ft::Executor executor(graph, params);
  ft::Workspace ws = executor.make_workspace();
  ft::Rng rng(2);
  for (int i = 0; i < batch * shape.seq_len; ++i) {
    ws.tokens.push_back(static_cast<int32_t>(rng.below(256)));
    ws.targets.push_back(static_cast<int32_t>(rng.below(256)));
  }
  ft::bench::run_profiled_steps(state, executor, params, ws, batch * shape.seq_len, "tokens");
}
BENCHMARK(BM_GptForwardBackward)
    ->ArgName("batch")
    ->Arg(4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
