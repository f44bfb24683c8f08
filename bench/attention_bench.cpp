// Causal attention forward + backward: the eager chain (AttentionScoresOp -> CausalSoftmaxOp ->
// AttentionMixOp, two [B, NH, T, T] intermediates) against FlashAttentionOp (online softmax over
// tiles, a [B, NH, T] log-sum-exp), q/k/v as views of one [B*T, 3C] buffer as after the QKV
// fusion. Shapes: B=4, NH=4, hd=32 at T = 64 (gpt_tiny), 256 and 1024, and gpt_small (B=8,
// T=128, C=256, NH=8). Flash runs at tile 256 (what tile_kb 256 picks; clamped to T) and 64.
// Counters:
//   stored_bytes  activations kept from forward for backward besides q, k, v, y
//                 (chain: scores + probs; flash: the log-sum-exp)
//   bytes         moved per step: forward from Op::cost (each input and output once), backward
//                 counted as twice that (inputs and output gradient read, input gradients written)
//   GB/s          bytes / time
//   build-attn/bench/attention_bench --benchmark_counters_tabular=true
// Env FT_THREADS sets the OpenMP threads (default 1).
#include <benchmark/benchmark.h>

#include <memory>

#include "bench/profiled_steps.h"
#include "core/rng.h"
#include "fusion/ops/flash_attention.h"
#include "model/executor.h"
#include "model/gradcheck.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/causal_softmax.h"

namespace {

constexpr int kPassTile = 256;  // what the pass picks at tile_kb 256 (clamped to T)

// One attention block plus a weighted-sum loss; tile 0 builds the eager chain.
struct AttentionBlock {
  AttentionBlock(int B, int T, int C, int NH, int tile) {
    const ft::ValueId qkv = graph.add_value("qkv", {int64_t{B} * T, 3 * C});
    const ft::ValueId q = graph.add_view("q", qkv, 0, C);
    const ft::ValueId k = graph.add_view("k", qkv, C, C);
    const ft::ValueId v = graph.add_view("v", qkv, 2 * C, C);
    const ft::ValueId y = graph.add_value("y", {B, T, C});
    if (tile > 0) {
      graph.add_op<ft::FlashAttentionOp>("flash", {q, k, v}, {y}, {}, B, T, C, NH, tile);
      stored_bytes = 4.0 * B * NH * T;
    } else {
      const ft::ValueId scores = graph.add_value("scores", {B, NH, T, T});
      const ft::ValueId probs = graph.add_value("probs", {B, NH, T, T});
      graph.add_op<ft::AttentionScoresOp>("scores", {q, k}, {scores}, {}, B, T, C, NH);
      graph.add_op<ft::CausalSoftmaxOp>("softmax", {scores}, {probs}, {}, B, NH, T);
      graph.add_op<ft::AttentionMixOp>("mix", {probs, v}, {y}, {}, B, T, C, NH);
      stored_bytes = 2 * 4.0 * B * NH * T * T;
    }
    for (const auto& op : graph.ops) {
      const ft::OpCost cost = op->cost(graph);
      bytes_per_step += 3 * (cost.bytes_read + cost.bytes_written);
    }
    graph.output = y;
    ft::add_weighted_sum_loss(graph, y, 1);
    params.allocate();
    executor = std::make_unique<ft::Executor>(graph, params);
    ws = executor->make_workspace();
    ft::Rng rng(2);
    for (int64_t i = 0; i < ws.values[qkv].numel(); ++i) ws.values[qkv].data()[i] = rng.normal();
  }

  ft::Graph graph;
  ft::ParamStore params;
  std::unique_ptr<ft::Executor> executor;
  ft::Workspace ws;
  double stored_bytes = 0, bytes_per_step = 0;
};

// Args: B, T, C, NH, tile (0: the eager chain; -1: the pass's tile).
void BM_Attention(benchmark::State& state) {
  ft::bench::set_threads_from_env();
  const int B = static_cast<int>(state.range(0)), T = static_cast<int>(state.range(1));
  const int C = static_cast<int>(state.range(2)), NH = static_cast<int>(state.range(3));
  int tile = static_cast<int>(state.range(4));
  if (tile < 0) tile = kPassTile < T ? kPassTile : T;
  state.SetLabel(tile == 0 ? "chain" : "flash tile " + std::to_string(tile));
  AttentionBlock block(B, T, C, NH, tile);
  ft::bench::run_profiled_steps(state, *block.executor, block.params, block.ws,
                                static_cast<double>(B) * T, "tokens");
  state.counters["stored_bytes"] = block.stored_bytes;
  state.counters["bytes"] = block.bytes_per_step;
  state.counters["GB/s"] = benchmark::Counter(block.bytes_per_step * state.iterations() / 1e9,
                                              benchmark::Counter::kIsRate);
}

void attention_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "T", "C", "NH", "tile"});
  for (int T : {64, 256, 1024})
    for (int tile : {0, -1, 64}) bench->Args({4, T, 128, 4, tile});
  for (int tile : {0, -1, 64}) bench->Args({8, 128, 256, 8, tile});  // gpt_small
}
BENCHMARK(BM_Attention)->Apply(attention_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
