// The horizontal fusions of issue 8 against their unfused twins, forward + backward:
//   Qkv*: one QkvLinearOp GEMM into [rows, 3C] vs three LinearOps over c_attn's row blocks;
//   HeadNorm*: one BatchedLayerNormOp vs 2·NH per-head LayerNormOps over hd = 32 column views
//   (qk_norm's eager form), with q's heads sharing one weight and k's another.
// Args: rows = B·T, C, NH, at gpt_tiny (512 = 8·64, 128, 4) and gpt_small (1024 = 8·128, 256, 8).
//   build-*/bench/fusion_qkv_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1).
// Counters: GB/s over the bytes the ops' cost() reports for forward, times 3 for forward plus
// backward (backward reads dy, x and the weights and writes dx and the weight gradients: about
// twice forward's traffic); GFLOP/s from cost()'s forward + backward FLOPs.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/fusion_bench_util.h"
#include "bench/profiled_steps.h"
#include "core/rng.h"
#include "fusion/ops/batched_layernorm.h"
#include "fusion/ops/qkv_linear.h"
#include "model/executor.h"
#include "model/ops/layernorm.h"
#include "model/ops/linear.h"

namespace {

using namespace ft;

using bench::OpBench;

void build_qkv(OpBench& b, int64_t rows, int64_t C, bool fused) {
  const ParamId weight = b.params.add("c_attn.weight", {3 * C, C}, ParamInit::kNormal, 0.02f, true);
  const ParamId bias = b.params.add("c_attn.bias", {3 * C}, ParamInit::kZeros, 0.0f, false);
  const ValueId x = b.graph.add_value("ln_1", {rows, C});
  if (fused) {
    const ValueId qkv = b.graph.add_value("qkv", {rows, 3 * C});
    b.graph.add_op<QkvLinearOp>("qkv", {x}, {qkv}, {weight, bias}, rows, C, C, 3, true, 0);
    b.finish(qkv);
    return;
  }
  ValueId last = -1;
  for (int part = 0; part < 3; ++part) {  // three [rows, C] roots, as the eager graph builds them
    const std::string name(1, "qkv"[part]);
    last = b.graph.add_value(name, {rows, C});
    b.graph.add_op<LinearOp>(name, {x}, {last}, {weight, bias}, rows, C, C, true, part * C);
  }
  b.finish(last);
}

void build_head_norms(OpBench& b, int64_t rows, int64_t C, int n_head, bool fused) {
  const int64_t hd = C / n_head;
  const ParamId params[] = {b.params.add("q_norm.weight", {hd}, ParamInit::kOnes, 0.0f, false),
                            b.params.add("q_norm.bias", {hd}, ParamInit::kZeros, 0.0f, false),
                            b.params.add("k_norm.weight", {hd}, ParamInit::kOnes, 0.0f, false),
                            b.params.add("k_norm.bias", {hd}, ParamInit::kZeros, 0.0f, false)};
  // q and k as the fused QKV GEMM leaves them: views of one [rows, 3C] buffer.
  const ValueId qkv = b.graph.add_value("qkv", {rows, 3 * C});
  const ValueId q_norm = b.graph.add_value("q_norm", {rows, C});
  const ValueId k_norm = b.graph.add_value("k_norm", {rows, C});
  std::vector<ValueId> ins, outs;
  std::vector<ParamId> ps;
  for (int part = 0; part < 2; ++part)
    for (int head = 0; head < n_head; ++head) {
      const std::string name = std::string(part ? "k" : "q") + "_norm." + std::to_string(head);
      ins.push_back(b.graph.add_view(name + ".in", qkv, part * C + head * hd, hd));
      outs.push_back(b.graph.add_view(name, part ? k_norm : q_norm, head * hd, hd));
      ps.insert(ps.end(), {params[2 * part], params[2 * part + 1]});
      if (!fused)
        b.graph.add_op<LayerNormOp>(name, {ins.back()}, {outs.back()},
                                    {params[2 * part], params[2 * part + 1]}, rows, hd);
    }
  if (fused) b.graph.add_op<BatchedLayerNormOp>("qk_norm", ins, outs, ps, rows, hd, 2 * n_head);
  b.finish(q_norm);
}

void BM_QkvThreeLinears(benchmark::State& state) {
  OpBench b;
  build_qkv(b, state.range(0), state.range(1), false);
  b.run(state);
}
void BM_QkvFused(benchmark::State& state) {
  OpBench b;
  build_qkv(b, state.range(0), state.range(1), true);
  b.run(state);
}
void BM_HeadNormPerHead(benchmark::State& state) {
  OpBench b;
  build_head_norms(b, state.range(0), state.range(1), static_cast<int>(state.range(2)), false);
  b.run(state);
}
void BM_HeadNormBatched(benchmark::State& state) {
  OpBench b;
  build_head_norms(b, state.range(0), state.range(1), static_cast<int>(state.range(2)), true);
  b.run(state);
}

void gpt_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"rows", "C", "NH"});
  bench->Args({512, 128, 4});   // gpt_tiny, B=8 T=64
  bench->Args({1024, 256, 8});  // gpt_small, B=8 T=128
  bench->Unit(benchmark::kMicrosecond)->UseRealTime();
}
BENCHMARK(BM_QkvThreeLinears)->Apply(gpt_shapes);
BENCHMARK(BM_QkvFused)->Apply(gpt_shapes);
BENCHMARK(BM_HeadNormPerHead)->Apply(gpt_shapes);
BENCHMARK(BM_HeadNormBatched)->Apply(gpt_shapes);

}  // namespace

BENCHMARK_MAIN();
