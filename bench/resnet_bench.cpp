// ResNet forward + backward benchmarks (no optimizer): resnet8 and resnet20 (width 16) at batch 64
// on one rank, with the per-op-kind time of a step as counters (ms, executor profiling), which is
// where to look first when a step gets slower; a 3x3 convolution's forward, and forward plus
// backward, at the three stage shapes with each ConvAlgorithm (the measurement behind kAuto's
// choice); and BatchNorm alone at those
// shapes, with the activation bytes it streams per second.
//   build/bench/resnet_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1, as train_step_bench).
#include <benchmark/benchmark.h>

#include <string>
#include <utility>
#include <vector>

#include "bench/profiled_steps.h"
#include "core/rng.h"
#include "model/executor.h"
#include "model/ops/batchnorm.h"
#include "model/ops/conv2d.h"
#include "model/ops/winograd.h"
#include "model/resnet.h"

namespace {

constexpr int kBatch = 64;

// Args: blocks per stage (1 = resnet8, 3 = resnet20), ConvAlgorithm as an int (0 auto, 1 onednn:
// model.conv_algorithm).
void BM_ResnetForwardBackward(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  ft::ResnetShape shape{static_cast<int>(state.range(0)), 16};
  shape.conv_algorithm = static_cast<ft::ConvAlgorithm>(state.range(1));
  ft::ParamStore params;
  ft::Graph graph = ft::build_resnet(shape, kBatch, params);
  params.allocate();
  params.initialize(1);
  ft::Executor executor(graph, params);
  ft::Workspace ws = executor.make_workspace();
  ft::Rng rng(2);
  ft::Tensor& images = ws.values[graph.input];
  for (int64_t i = 0; i < images.numel(); ++i) images.data()[i] = rng.normal();
  for (int b = 0; b < kBatch; ++b) ws.targets.push_back(static_cast<int32_t>(rng.below(10)));
  ft::bench::run_profiled_steps(state, executor, params, ws, kBatch, "images");
}
BENCHMARK(BM_ResnetForwardBackward)
    ->ArgNames({"blocks", "algorithm"})
    ->ArgsProduct({{1, 3}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: channels, spatial size (16/28, 32/14, 64/7 are ResNet's stages at width 16), and
// Args: channels, spatial size, ConvAlgorithm as an int (2 direct, 3 transposed, 4 Winograd
// F4x4, 5 = 4 with F2x2), 1 to add backward, the Winograd kernels' vector lanes (8 AVX2, 16
// AVX-512; skipped where the CPU lacks them; 0 for oneDNN) and the batch.
// GFLOP/s counts the direct convolution's flops (2 * 9 * C * outputs per pass), so Winograd's
// figure is an effective rate that can pass the core's peak.
void conv_passes(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  const int channels = static_cast<int>(state.range(0));
  const int size = static_cast<int>(state.range(1));
  const bool with_backward = state.range(3) != 0;
  const int lanes = static_cast<int>(state.range(4));
  const int batch = static_cast<int>(state.range(5));
  const ft::WinogradIsa saved_isa = ft::winograd_isa();
  if (lanes != 0) {
    const ft::WinogradIsa isa = lanes == 16 ? ft::WinogradIsa::kAvx512 : ft::WinogradIsa::kAvx2;
    if (!ft::winograd_isa_available(isa)) {
      state.SkipWithError("this CPU has no AVX-512");
      return;
    }
    ft::winograd_set_isa(isa);
  }
  ft::ParamStore params;
  const ft::ParamId weight =
      params.add("weight", {channels, channels, 3, 3}, ft::ParamInit::kNormal, 0.1f, true);
  params.allocate();
  params.initialize(1);
  ft::Conv2dOp op(batch, channels, channels, size, size, 3, 1, 1);
  const bool f2 = state.range(2) == 5;
  op.algorithm = f2 ? ft::ConvAlgorithm::kWinograd : static_cast<ft::ConvAlgorithm>(state.range(2));
  op.winograd_tile = f2 ? ft::WinogradTile::k2x2 : ft::WinogradTile::k4x4;
  op.inputs = {0};
  op.outputs = {1};
  op.params = {weight};
  ft::Workspace ws;
  ft::Rng rng(4);
  for (int value = 0; value < 2; ++value) {
    const ft::Shape shape = value == 0 ? op.input_shape() : op.output_shape();
    ws.values.push_back(ft::Tensor::zeros(shape));
    ws.grads.push_back(ft::Tensor::zeros(shape));
    for (int64_t i = 0; i < ws.values.back().numel(); ++i)
      ws.values.back().data()[i] = rng.normal();
    for (int64_t i = 0; i < ws.grads.back().numel(); ++i) ws.grads.back().data()[i] = rng.normal();
  }
  for (auto _ : state) {
    op.forward(ws, params);
    if (with_backward) op.backward(ws, params);
  }
  ft::winograd_set_isa(saved_isa);
  state.SetLabel(lanes == 0
                     ? std::string(op.forward_impl())
                     : std::string(op.forward_impl()) + "/" + (lanes == 16 ? "avx512" : "avx2"));
  const double passes = with_backward ? 3.0 : 1.0;
  state.counters["GFLOP/s"] = benchmark::Counter(
      passes * 2.0 * 9 * channels * static_cast<double>(ft::shape_numel(op.output_shape())) *
          state.iterations() / 1e9,
      benchmark::Counter::kIsRate);
}
// The three stage shapes: oneDNN's two algorithms, then both Winograd tiles at both widths.
void stage_shapes(benchmark::internal::Benchmark* bench,
                  const std::vector<int64_t>& onednn_algorithms, int64_t backward,
                  const std::vector<int64_t>& batches) {
  bench->ArgNames({"channels", "size", "algorithm", "backward", "lanes", "batch"});
  for (const auto& [channels, size] : {std::pair<int64_t, int64_t>{16, 28}, {32, 14}, {64, 7}}) {
    bench->ArgsProduct({{channels}, {size}, onednn_algorithms, {backward}, {0}, batches});
    bench->ArgsProduct({{channels}, {size}, {4, 5}, {backward}, {8, 16}, batches});
  }
}
void BM_Conv2dForward(benchmark::State& state) {
  conv_passes(state);
}
BENCHMARK(BM_Conv2dForward)
    ->Apply([](benchmark::internal::Benchmark* bench) {
      stage_shapes(bench, {2, 3}, 0, {1, 64});
    })
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
void BM_Conv2dForwardBackward(benchmark::State& state) {
  conv_passes(state);
}
BENCHMARK(BM_Conv2dForwardBackward)
    ->Apply([](benchmark::internal::Benchmark* bench) { stage_shapes(bench, {2}, 1, {kBatch}); })
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: channels, spatial size.
void BM_BatchNormForwardBackward(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  const int channels = static_cast<int>(state.range(0));
  const int size = static_cast<int>(state.range(1));
  const ft::Shape shape{kBatch, size, size, channels};
  ft::ParamStore params;
  std::vector<ft::ParamId> ids;
  ids.push_back(params.add("weight", {channels}, ft::ParamInit::kOnes, 0.0f, false));
  ids.push_back(params.add("bias", {channels}, ft::ParamInit::kZeros, 0.0f, false));
  ids.push_back(params.add_buffer("running_mean", {channels}, ft::ParamInit::kZeros));
  ids.push_back(params.add_buffer("running_var", {channels}, ft::ParamInit::kOnes));
  params.allocate();
  params.initialize(1);
  ft::BatchNorm2dOp op(kBatch, channels, size, size);
  op.inputs = {0};
  op.outputs = {1};
  op.params = ids;
  ft::Workspace ws;
  ft::Rng rng(3);
  for (int value = 0; value < 2; ++value) {
    ws.values.push_back(ft::Tensor::empty(shape));
    ws.grads.push_back(ft::Tensor::empty(shape));
    for (ft::Tensor* tensor : {&ws.values.back(), &ws.grads.back()})
      for (int64_t i = 0; i < tensor->numel(); ++i) tensor->data()[i] = rng.normal();
  }
  for (auto _ : state) {
    op.forward(ws, params);
    op.backward(ws, params);
  }
  // Forward reads x twice and writes y; backward reads x and dy twice and dx once, writes dx.
  const double bytes_per_step = 9.0 * static_cast<double>(ft::shape_numel(shape)) * sizeof(float);
  state.counters["GB/s"] =
      benchmark::Counter(bytes_per_step * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_BatchNormForwardBackward)
    ->ArgNames({"channels", "size"})
    ->Args({16, 28})
    ->Args({32, 14})
    ->Args({64, 7})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
