// ResNet forward + backward benchmarks (no optimizer): resnet8 and resnet20 (width 16) at batch 64
// on one rank, with the convolutions on plain layouts and on the automatic choice, which is the
// measurement behind ConvLayout::kAuto.
//   build/bench/resnet_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1, as train_step_bench).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdlib>

#include "core/rng.h"
#include "model/executor.h"
#include "model/ops/conv2d.h"
#include "model/resnet.h"

namespace {

constexpr int kBatch = 64;

// Args: blocks per stage (1 = resnet8, 3 = resnet20), ConvLayout as an int.
void BM_ResnetForwardBackward(benchmark::State& state) {
  const char* threads = std::getenv("FT_THREADS");
  omp_set_num_threads(threads ? std::atoi(threads) : 1);
  const int blocks = static_cast<int>(state.range(0));
  const auto layout = static_cast<ft::ConvLayout>(state.range(1));
  ft::ParamStore params;
  ft::Graph graph = ft::build_resnet({blocks, 16}, kBatch, params);
  for (auto& op : graph.ops)
    if (auto* conv = dynamic_cast<ft::Conv2dOp*>(op.get())) conv->layout = layout;
  params.allocate();
  params.initialize(1);
  ft::Executor executor(graph, params);
  ft::Workspace ws = executor.make_workspace();
  ft::Rng rng(2);
  ft::Tensor& images = ws.values[graph.input];
  for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = rng.normal();
  for (int b = 0; b < kBatch; ++b) ws.targets.push_back(static_cast<int32_t>(rng.below(10)));
  for (int i = 0; i < 2; ++i) {  // build primitives, warm the allocator
    executor.forward(ws);
    executor.backward(ws);
  }
  for (auto _ : state) {
    params.zero_grads();
    executor.forward(ws);
    executor.backward(ws);
  }
  state.counters["images/s"] =
      benchmark::Counter(kBatch * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ResnetForwardBackward)
    ->ArgNames({"blocks", "layout"})
    ->ArgsProduct({{1, 3},
                   {static_cast<int>(ft::ConvLayout::kAuto),
                    static_cast<int>(ft::ConvLayout::kPlain)}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
