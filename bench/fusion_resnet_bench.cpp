// The ResNet vertical fusions against their unfused chains, forward + backward, at resnet8's
// three stage shapes (batch 64: 28x28x16, 14x14x32, 7x7x64):
//   BM_BatchNormRelu  BatchNormReluOp       vs BatchNorm2dOp -> ReluOp
//   BM_AddRelu        AddReluOp             vs ResidualAddOp -> ReluOp
//   BM_BatchNormAddRelu BatchNormAddReluOp  vs BatchNorm2dOp [+ BatchNorm2dOp] -> ResidualAddOp
//                                              -> ReluOp (identity or normalised shortcut)
// Ops run directly on a hand-built workspace with fresh input gradients, as the executor hands
// them over in a ResNet step, so the times are the ops' alone.
// Counters:
//   bytes  activation bytes streamed per step, counted per pass over memory (see below)
//   GB/s   bytes / time
//   build-resnet/bench/fusion_resnet_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/profiled_steps.h"
#include "core/rng.h"
#include "fusion/ops/add_relu.h"
#include "fusion/ops/batchnorm_add_relu.h"
#include "fusion/ops/batchnorm_relu.h"
#include "model/ops/batchnorm.h"
#include "model/ops/relu.h"
#include "model/ops/residual.h"

namespace {

constexpr int kBatch = 64;

// Floats streamed per element and step:
//   BatchNorm2dOp forward reads x twice, writes z (3); ReluOp forward reads z, writes y (2);
//   ReluOp backward reads y and dy, writes dz (3); BatchNorm2dOp backward reads x and dz twice,
//   writes dx (5): 13. BatchNormReluOp: forward 3, backward reads x and dy twice (the mask is
//   recomputed from x), writes dx (5): 8.
constexpr double kBatchNormReluUnfusedFloats = 13, kBatchNormReluFusedFloats = 8;
//   ResidualAddOp forward reads a, b, writes s (3); ReluOp 2 + 3 as above; ResidualAddOp
//   backward reads ds, writes da, db (3): 11. AddReluOp: forward 3, backward reads y and dy,
//   writes da and db (4): 7.
constexpr double kAddReluUnfusedFloats = 11, kAddReluFusedFloats = 7;
//   BatchNorm2dOp -> ResidualAddOp -> ReluOp: 8 + 3 + 5 + 3 = 19; the shortcut's BatchNorm2dOp
//   another 8: 27. BatchNormAddReluOp: forward reads x twice and r, writes y (4), backward reads
//   dy, y and x twice, writes dx and dr (8): 12; with the shortcut's BatchNorm forward 5, backward
//   reads dy, x and x_s twice (u = z + z_s recomputed), writes dx and dx_s (8): 13.
constexpr double kBatchNormAddReluUnfusedFloats[] = {19, 27};
constexpr double kBatchNormAddReluFusedFloats[] = {12, 13};

// A workspace of `count` values of `shape`, values and gradients ~ N(0, 1), every gradient
// fresh (the ops overwrite them).
ft::Workspace make_workspace(const ft::Shape& shape, int count) {
  ft::Workspace ws;
  ft::Rng rng(3);
  for (int value = 0; value < count; ++value) {
    ws.values.push_back(ft::Tensor::empty(shape));
    ws.grads.push_back(ft::Tensor::empty(shape));
    ws.row_strides.push_back(shape.back());
    for (ft::Tensor* tensor : {&ws.values.back(), &ws.grads.back()})
      for (int64_t i = 0; i < tensor->numel(); ++i) tensor->data()[i] = rng.normal();
  }
  ws.grad_fresh.assign(count, 1);
  return ws;
}

void wire(ft::Op& op, std::vector<ft::ValueId> inputs, std::vector<ft::ValueId> outputs,
          std::vector<ft::ParamId> params) {
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  op.params = std::move(params);
}

void set_bytes(benchmark::State& state, double floats_per_element, int64_t numel) {
  const double bytes = floats_per_element * static_cast<double>(numel) * sizeof(float);
  state.counters["bytes"] = bytes;
  state.counters["GB/s"] =
      benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// Runs forward over `ops` in order, then backward in reverse, once per iteration.
void run_steps(benchmark::State& state, const std::vector<ft::Op*>& ops, ft::Workspace& ws,
               ft::ParamStore& params) {
  for (auto _ : state) {
    for (ft::Op* op : ops) op->forward(ws, params);
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) (*it)->backward(ws, params);
  }
}

// Args: channels, spatial size, fused (0 = BatchNorm2dOp -> ReluOp, 1 = BatchNormReluOp).
void BM_BatchNormRelu(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  const int channels = static_cast<int>(state.range(0));
  const int size = static_cast<int>(state.range(1));
  const bool fused = state.range(2) != 0;
  const ft::Shape shape{kBatch, size, size, channels};
  ft::ParamStore params;
  std::vector<ft::ParamId> ids;
  ids.push_back(params.add("weight", {channels}, ft::ParamInit::kNormal, 1.0f, false));
  ids.push_back(params.add("bias", {channels}, ft::ParamInit::kNormal, 1.0f, false));
  ids.push_back(params.add_buffer("running_mean", {channels}, ft::ParamInit::kZeros));
  ids.push_back(params.add_buffer("running_var", {channels}, ft::ParamInit::kOnes));
  params.allocate();
  params.initialize(1);
  ft::Workspace ws = make_workspace(shape, 3);  // x, z (unfused only), y
  std::vector<std::unique_ptr<ft::Op>> owned;
  if (fused) {
    owned.push_back(std::make_unique<ft::BatchNormReluOp>(kBatch, channels, size, size));
    wire(*owned[0], {0}, {2}, ids);
  } else {
    owned.push_back(std::make_unique<ft::BatchNorm2dOp>(kBatch, channels, size, size));
    wire(*owned[0], {0}, {1}, ids);
    owned.push_back(std::make_unique<ft::ReluOp>(ft::shape_numel(shape)));
    wire(*owned[1], {1}, {2}, {});
  }
  std::vector<ft::Op*> ops;
  for (auto& op : owned) ops.push_back(op.get());
  run_steps(state, ops, ws, params);
  set_bytes(state, fused ? kBatchNormReluFusedFloats : kBatchNormReluUnfusedFloats,
            ft::shape_numel(shape));
}

// Args: channels, spatial size, fused (0 = ResidualAddOp -> ReluOp, 1 = AddReluOp).
void BM_AddRelu(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  const int channels = static_cast<int>(state.range(0));
  const int size = static_cast<int>(state.range(1));
  const bool fused = state.range(2) != 0;
  const ft::Shape shape{kBatch, size, size, channels};
  const int64_t numel = ft::shape_numel(shape);
  ft::ParamStore params;
  params.allocate();
  ft::Workspace ws = make_workspace(shape, 4);  // a, b, s (unfused only), y
  std::vector<std::unique_ptr<ft::Op>> owned;
  if (fused) {
    owned.push_back(std::make_unique<ft::AddReluOp>(numel));
    wire(*owned[0], {0, 1}, {3}, {});
  } else {
    owned.push_back(std::make_unique<ft::ResidualAddOp>(numel));
    wire(*owned[0], {0, 1}, {2}, {});
    owned.push_back(std::make_unique<ft::ReluOp>(numel));
    wire(*owned[1], {2}, {3}, {});
  }
  std::vector<ft::Op*> ops;
  for (auto& op : owned) ops.push_back(op.get());
  run_steps(state, ops, ws, params);
  set_bytes(state, fused ? kAddReluFusedFloats : kAddReluUnfusedFloats, numel);
}

// Args: channels, spatial size, fused (0/1), normalised shortcut (0/1).
void BM_BatchNormAddRelu(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  const int channels = static_cast<int>(state.range(0));
  const int size = static_cast<int>(state.range(1));
  const bool fused = state.range(2) != 0, normalised = state.range(3) != 0;
  const ft::Shape shape{kBatch, size, size, channels};
  const int64_t numel = ft::shape_numel(shape);
  ft::ParamStore params;
  std::vector<ft::ParamId> ids;
  for (int bn = 0; bn < (normalised ? 2 : 1); ++bn) {
    const std::string prefix = "bn" + std::to_string(bn);
    ids.push_back(params.add(prefix + ".weight", {channels}, ft::ParamInit::kNormal, 1.0f, false));
    ids.push_back(params.add(prefix + ".bias", {channels}, ft::ParamInit::kNormal, 1.0f, false));
    ids.push_back(params.add_buffer(prefix + ".running_mean", {channels}, ft::ParamInit::kZeros));
    ids.push_back(params.add_buffer(prefix + ".running_var", {channels}, ft::ParamInit::kOnes));
  }
  params.allocate();
  params.initialize(1);
  // x, r or x_s, y; unfused also z, z_s, the sum.
  ft::Workspace ws = make_workspace(shape, 6);
  std::vector<std::unique_ptr<ft::Op>> owned;
  const std::vector<ft::ParamId> main_ids(ids.begin(), ids.begin() + 4);
  if (fused) {
    const ft::BatchNormSettings settings;
    owned.push_back(std::make_unique<ft::BatchNormAddReluOp>(kBatch, channels, size, size, settings,
                                                             normalised ? &settings : nullptr));
    wire(*owned[0], {0, 1}, {2}, ids);
  } else {
    owned.push_back(std::make_unique<ft::BatchNorm2dOp>(kBatch, channels, size, size));
    wire(*owned.back(), {0}, {3}, main_ids);
    ft::ValueId summand = 1;
    if (normalised) {
      owned.push_back(std::make_unique<ft::BatchNorm2dOp>(kBatch, channels, size, size));
      wire(*owned.back(), {1}, {4}, std::vector<ft::ParamId>(ids.begin() + 4, ids.end()));
      summand = 4;
    }
    owned.push_back(std::make_unique<ft::ResidualAddOp>(numel));
    wire(*owned.back(), {3, summand}, {5}, {});
    owned.push_back(std::make_unique<ft::ReluOp>(numel));
    wire(*owned.back(), {5}, {2}, {});
  }
  std::vector<ft::Op*> ops;
  for (auto& op : owned) ops.push_back(op.get());
  run_steps(state, ops, ws, params);
  set_bytes(state,
            (fused ? kBatchNormAddReluFusedFloats : kBatchNormAddReluUnfusedFloats)[normalised],
            numel);
}

void resnet8_shapes(benchmark::internal::Benchmark* benchmark) {
  benchmark->ArgNames({"channels", "size", "fused"});
  for (const auto& [channels, size] : {std::pair{16, 28}, {32, 14}, {64, 7}})
    for (int fused : {0, 1}) benchmark->Args({channels, size, fused});
  benchmark->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_BatchNormRelu)->Apply(resnet8_shapes);
BENCHMARK(BM_AddRelu)->Apply(resnet8_shapes);

// resnet8's adds: the identity block at 28x28x16, the downsampling blocks at 14x14x32 and 7x7x64.
void resnet8_adds(benchmark::internal::Benchmark* benchmark) {
  benchmark->ArgNames({"channels", "size", "fused", "bn_shortcut"});
  for (const auto& [channels, size, normalised] : {std::tuple{16, 28, 0}, {32, 14, 1}, {64, 7, 1}})
    for (int fused : {0, 1}) benchmark->Args({channels, size, fused, normalised});
  benchmark->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_BatchNormAddRelu)->Apply(resnet8_adds);

}  // namespace

BENCHMARK_MAIN();
