// The GEMMs of one gpt_tiny training step (rows = B*T = 256, d_model 128), one at a time through
// core/gemm.h, in GFLOP/s against this core's fp32 peak (about 90 single-threaded): which of a
// linear layer's three matmuls (forward, dx, dW) leaves speed on the table.
//   build/bench/gemm_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1).
#include <benchmark/benchmark.h>

#include <vector>

#include "bench/profiled_steps.h"
#include "core/bf16_cast.h"
#include "core/gemm.h"

namespace {

// The GEMM shape of a benchmark's first three args (m, n, k), after setting its threads.
ft::GemmArgs shape_of(const benchmark::State& state) {
  ft::bench::set_threads_from_env();
  ft::GemmArgs args;
  args.m = state.range(0);
  args.n = state.range(1);
  args.k = state.range(2);
  return args;
}

// Args: m, n, k, transpose_a, transpose_b, accumulate, bf16 (0: fp32 operands, 1: bf16).
void BM_Gemm(benchmark::State& state) {
  ft::GemmArgs args = shape_of(state);
  args.transpose_a = state.range(3) != 0;
  args.transpose_b = state.range(4) != 0;
  args.accumulate = state.range(5) != 0;
  std::vector<float> a(args.m * args.k, 0.5f), b(args.k * args.n, 0.25f), c(args.m * args.n, 0.0f);
  if (state.range(6) != 0) {
    std::vector<ft::bf16_bits> a16(a.size()), b16(b.size());
    ft::cast_to_bf16(a16.data(), a.data(), static_cast<int64_t>(a.size()));
    ft::cast_to_bf16(b16.data(), b.data(), static_cast<int64_t>(b.size()));
    for (auto _ : state) ft::gemm(c.data(), a16.data(), b16.data(), args);
  } else {
    for (auto _ : state) ft::gemm(c.data(), a.data(), b.data(), args);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * args.m * args.n * args.k * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
// For each linear (in -> out) of a GPT block at rows 256: forward y = x W^T, dx += dy W,
// dW += dy^T x, and two variants of dW that show what its transposed operand costs: without the
// accumulate, and with dy already transposed.
void linear_shapes(benchmark::internal::Benchmark* bench) {
  const int rows = 256;
  for (const auto& [in, out] :
       std::vector<std::pair<int, int>>{{128, 384}, {128, 128}, {128, 512}, {512, 128}}) {
    bench->Args({rows, out, in, 0, 1, 0, 0});  // forward
    bench->Args({rows, in, out, 0, 0, 1, 0});  // dx
    bench->Args({out, in, rows, 1, 0, 1, 0});  // dW
    bench->Args({out, in, rows, 1, 0, 0, 0});  // dW, no accumulate
    bench->Args({out, in, rows, 0, 0, 1, 0});  // dW with dy pre-transposed
  }
}
// gpt_small's MLP c_fc (rows 1024, 256 -> 1024) in fp32 and bf16: forward and dx over all rows,
// and over the row tiles Linear+GELU runs them in (64 rows at fusion.tile_kb 256, 256 at the
// default 1024), which shows what tiling costs each precision's GEMM.
void mlp_tile_shapes(benchmark::internal::Benchmark* bench) {
  for (int bf16 : {0, 1})
    for (int rows : {1024, 256, 64}) {
      bench->Args({rows, 1024, 256, 0, 1, 0, bf16});  // forward
      bench->Args({rows, 256, 1024, 0, 0, 0, bf16});  // dx
    }
}
// gpt_small's four linears (rows 1024) in bf16, each of the three GEMMs of a training step: where
// a bf16 step's GEMM time goes, and whether dW's transposed operand costs more than in fp32.
void gpt_small_bf16_shapes(benchmark::internal::Benchmark* bench) {
  const int rows = 1024;
  for (const auto& [in, out] :
       std::vector<std::pair<int, int>>{{256, 768}, {256, 256}, {256, 1024}, {1024, 256}}) {
    bench->Args({rows, out, in, 0, 1, 0, 1});  // forward
    bench->Args({rows, in, out, 0, 0, 1, 1});  // dx
    bench->Args({out, in, rows, 1, 0, 1, 1});  // dW
    bench->Args({out, in, rows, 0, 0, 1, 1});  // dW with dy pre-transposed
  }
}
BENCHMARK(BM_Gemm)
    ->ArgNames({"m", "n", "k", "ta", "tb", "acc", "bf16"})
    ->Apply(linear_shapes)
    ->Apply(mlp_tile_shapes)
    ->Apply(gpt_small_bf16_shapes)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// gpt_small's QKV GEMM (rows 1024, 256 -> 768, bias) writing bf16 q, k, v: oneDNN rounding C as it
// stores it (gemm_bf16_output, variant 1) against the fp32 C of gemm then a rounding pass
// (variant 0, the row-tile path where the CPU has no bf16 instructions).
// Args: m, n, k, variant.
void BM_Bf16Output(benchmark::State& state) {
  ft::GemmArgs args = shape_of(state);
  args.transpose_b = true;
  std::vector<float> bias(args.n, 0.1f), c(args.m * args.n);
  args.bias = bias.data();
  std::vector<ft::bf16_bits> a(args.m * args.k, ft::float_to_bf16(0.5f)),
      b(args.k * args.n, ft::float_to_bf16(0.25f)), c16(args.m * args.n);
  if (!ft::bf16_gemm_native()) return state.SkipWithError("no bf16 instructions here");
  for (auto _ : state) {
    if (state.range(3) != 0) {
      ft::gemm_bf16_output(c16.data(), a.data(), b.data(), args);
    } else {
      ft::gemm(c.data(), a.data(), b.data(), args);
      ft::cast_rows_to_bf16(c16.data(), args.n, c.data(), args.n, args.m, args.n);
    }
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * args.m * args.n * args.k * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Bf16Output)
    ->ArgNames({"m", "n", "k", "variant"})
    ->Args({1024, 768, 256, 0})
    ->Args({1024, 768, 256, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
