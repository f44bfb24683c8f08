// OpBench, shared by the fusion benches (bench/fusion_*_bench.cpp): the ops under test in a
// graph with their workspace, driven directly (forward in order, backward in reverse, without
// the executor's zeroing: accumulating is the same work), and the counters they report.
// Counters: ops, MB (3x the forward bytes of the ops' cost(): backward moves about twice
// forward's traffic), GB/s over those bytes and GFLOP/s over cost()'s forward + backward FLOPs.
// Thread safety: one benchmark thread; FT_THREADS sets the OpenMP threads.
#pragma once
#include <benchmark/benchmark.h>

#include <memory>

#include "bench/profiled_steps.h"
#include "core/rng.h"
#include "model/executor.h"

namespace ft::bench {

struct OpBench {
  ParamStore params;
  Graph graph;
  std::unique_ptr<Executor> executor;
  Workspace ws;

  // Allocates and initialises params and the workspace; every value and gradient that owns
  // storage (views share their root's) gets small random numbers.
  void finish(ValueId any_output) {
    graph.loss = any_output;  // the executor only needs one to exist
    params.allocate();
    params.initialize(1);
    executor = std::make_unique<Executor>(graph, params);
    ws = executor->make_workspace();
    ws.dropout_seed = 99;
    Rng rng(2);
    for (ValueId id = 0; id < static_cast<ValueId>(graph.values.size()); ++id) {
      if (graph.values[id].is_view()) continue;
      for (Tensor* t : {&ws.values[id], &ws.grads[id]})
        if (t->defined())
          for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = 0.1f * rng.normal();
    }
  }
  void step() {
    for (const auto& op : graph.ops) op->forward(ws, params);
    for (auto op = graph.ops.rbegin(); op != graph.ops.rend(); ++op) (*op)->backward(ws, params);
  }
  void run(benchmark::State& state) {
    set_threads_from_env();
    double bytes = 0, flops = 0;
    for (const auto& op : graph.ops) {
      const OpCost cost = op->cost(graph);
      bytes += 3 * (cost.bytes_read + cost.bytes_written);
      flops += cost.forward_flops + cost.backward_flops;
    }
    for (auto _ : state) step();
    state.counters["ops"] = static_cast<double>(graph.ops.size());
    state.counters["MB"] = bytes / 1e6;
    state.counters["GB/s"] =
        benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  }
};

}  // namespace ft::bench
