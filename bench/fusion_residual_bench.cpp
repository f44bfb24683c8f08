// fusion.vertical.residual_layernorm and fusion.horizontal.multi_tensor against their twins:
//   ResidualLn*: one ResidualLayerNormOp vs DropoutOp -> ResidualAddOp -> LayerNormOp, forward +
//   backward, at gpt_tiny (rows 256 = 4·64 and 512 = 8·64, C 128) and gpt_small (rows 1024 =
//   8·128, C 256), with dropout 0.1 and without (dropout_pct 0: residual add -> LayerNorm);
//   Sweep*: the optimizer step's parameter sweeps over gpt_tiny's 0.83M parameters (AdamW step,
//   gradient zeroing, global norm with clipping, and all three as one step's worth), per tensor
//   (multi 0) vs one chunked pass each (multi 1); a step's worth also with the clip's scale and
//   the zeroing folded into the update (multi 2), and over gpt_small's 4.84M (gpt_small 1).
//   build-*/bench/fusion_residual_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1; the multi-tensor target is stated for 2).
// Counters: GB/s over the bytes each variant moves. ResidualLn: 3x the forward bytes of the ops'
// cost() (backward reads the saved rows and both output gradients and writes two input
// gradients: about twice forward's traffic), so the fused op's smaller count is its saving.
// Sweep: AdamW reads value, grad, m, v and writes value, m, v (28 B/param); zeroing writes 4 B;
// the norm reads 4 B and clipping reads and writes 8 B more.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench/fusion_bench_util.h"
#include "bench/profiled_steps.h"
#include "core/rng.h"
#include "fusion/multi_tensor.h"
#include "fusion/ops/residual_layernorm.h"
#include "kernels/step_control.h"
#include "model/executor.h"
#include "model/gpt.h"
#include "model/ops/dropout.h"
#include "model/ops/layernorm.h"
#include "model/ops/residual.h"
#include "model/optimizer.h"

namespace {

using namespace ft;

constexpr uint64_t kSalt = 0x6470;

using bench::OpBench;

// residual_in + dropout(branch) -> sum -> LayerNorm, as one op or as the eager chain.
void build_residual_ln(OpBench& b, int64_t rows, int64_t C, float p, bool fused) {
  const ParamId weight = b.params.add("ln.weight", {C}, ParamInit::kOnes, 0.0f, false);
  const ParamId bias = b.params.add("ln.bias", {C}, ParamInit::kZeros, 0.0f, false);
  const ValueId x = b.graph.add_value("residual_in", {rows, C});
  const ValueId branch = b.graph.add_value("branch", {rows, C});
  const ValueId sum = b.graph.add_value("sum", {rows, C});
  const ValueId normed = b.graph.add_value("normed", {rows, C});
  if (fused) {
    const int tile_rows = static_cast<int>(256 * 1024 / ResidualLayerNormOp::live_bytes_per_row(C));
    b.graph.add_op<ResidualLayerNormOp>("residual+ln", {x, branch}, {sum, normed}, {weight, bias},
                                        rows, C, p, kSalt, tile_rows);
  } else {
    ValueId summand = branch;
    if (p > 0.0f) {
      summand = b.graph.add_value("dropped", {rows, C});
      b.graph.add_op<DropoutOp>("dropout", {branch}, {summand}, {}, rows * C, p, kSalt);
    }
    b.graph.add_op<ResidualAddOp>("residual", {x, summand}, {sum}, {}, rows * C);
    b.graph.add_op<LayerNormOp>("ln", {sum}, {normed}, {weight, bias}, rows, C);
  }
  b.finish(normed);
}

void BM_ResidualLnUnfused(benchmark::State& state) {
  OpBench b;
  build_residual_ln(b, state.range(0), state.range(1), state.range(2) / 100.0f, false);
  b.run(state);
}

void BM_ResidualLnFused(benchmark::State& state) {
  OpBench b;
  build_residual_ln(b, state.range(0), state.range(1), state.range(2) / 100.0f, true);
  b.run(state);
}

void residual_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"rows", "C", "dropout_pct"});
  for (int dropout_pct : {10, 0}) {
    bench->Args({256, 128, dropout_pct});
    bench->Args({512, 128, dropout_pct});
    bench->Args({1024, 256, dropout_pct});
  }
  bench->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_ResidualLnUnfused)->Apply(residual_shapes);
BENCHMARK(BM_ResidualLnFused)->Apply(residual_shapes);

// gpt_tiny's parameters (n_layer 4, n_head 4, d_model 128, seq_len 64, vocab 256), with
// gradients large enough that clipping at 1 scales them.
struct SweepBench {
  ParamStore params;
  std::unique_ptr<Optimizer> optimizer;
  std::shared_ptr<ParamSweep> sweep;
  std::vector<float> saved_grads;  // what backward leaves, restored before each timed sweep

  explicit SweepBench(bool multi, bool gpt_small = false) {
    const GptShape shape = gpt_small ? GptShape{6, 8, 256, 128, 256, 0.0f, false}
                                     : GptShape{4, 4, 128, 64, 256, 0.0f, false};
    register_gpt_params(shape, params);
    params.allocate();
    params.initialize(1);
    OptimizerOptions options;
    options.weight_decay = 0.1f;
    sweep = multi ? make_multi_tensor_sweep(params) : make_per_tensor_sweep();
    optimizer = make_optimizer(options, params, sweep);
    Rng rng(3);
    saved_grads.resize(params.num_trainable_floats());
    for (float& grad : saved_grads) grad = 0.01f * rng.normal();
    restore_grads();
  }
  void restore_grads() {
    std::copy(saved_grads.begin(), saved_grads.end(), params.flat_grads().data());
  }
  void counters(benchmark::State& state, double bytes_per_param) const {
    const double bytes = bytes_per_param * static_cast<double>(params.num_trainable_floats());
    state.counters["params"] = static_cast<double>(params.num_trainable_floats());
    state.counters["GB/s"] =
        benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  }
};

void BM_SweepAdamW(benchmark::State& state) {
  bench::set_threads_from_env();
  SweepBench b(state.range(0) != 0);
  for (auto _ : state) b.optimizer->step(b.params, 1e-4f);
  b.counters(state, 28);
}

void BM_SweepZeroGrads(benchmark::State& state) {
  bench::set_threads_from_env();
  SweepBench b(state.range(0) != 0);
  for (auto _ : state) b.sweep->zero(b.params);
  b.counters(state, 4);
}

// Every iteration starts from the same gradients (restored untimed, as backward would leave
// them), so clipping at 0.5 scales them each time.
void BM_SweepGradNormClip(benchmark::State& state) {
  bench::set_threads_from_env();
  SweepBench b(state.range(0) != 0);
  for (auto _ : state) {
    state.PauseTiming();
    b.restore_grads();
    state.ResumeTiming();
    benchmark::DoNotOptimize(clip_grad_norm(b.params, 0.5f, *b.sweep));
  }
  b.counters(state, 12);
}

// What a training step spends outside forward and backward on the parameters: clip, step, zero;
// multi 2 is the trainer's multi-tensor step, the clip's scale and the zeroing folded into the
// update (ParamSweep::fold_into_next_update). gpt_small 1: its 4.84M parameters (19 MB a buffer,
// past L2 and most of L3) instead of gpt_tiny's 0.83M.
void BM_SweepStep(benchmark::State& state) {
  bench::set_threads_from_env();
  const bool folded = state.range(0) == 2;
  SweepBench b(state.range(0) != 0, state.range(1) != 0);
  for (auto _ : state) {
    state.PauseTiming();
    b.restore_grads();
    state.ResumeTiming();
    if (folded) {
      b.sweep->fold_into_next_update(b.params,
                                     clip_grad_scale(grad_norm(b.params, *b.sweep), 0.5f));
      b.optimizer->step(b.params, 1e-4f);
    } else {
      benchmark::DoNotOptimize(clip_grad_norm(b.params, 0.5f, *b.sweep));
      b.optimizer->step(b.params, 1e-4f);
      b.sweep->zero(b.params);
    }
  }
  b.counters(state, folded ? 36 : 44);
}

void sweep_modes(benchmark::internal::Benchmark* bench) {
  bench->ArgName("multi")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_SweepAdamW)->Apply(sweep_modes);
BENCHMARK(BM_SweepZeroGrads)->Apply(sweep_modes);
BENCHMARK(BM_SweepGradNormClip)->Apply(sweep_modes);
BENCHMARK(BM_SweepStep)
    ->ArgNames({"multi", "gpt_small"})
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
