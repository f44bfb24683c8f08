// Shared by the model benchmarks: times forward + backward steps of a ready executor (after two
// warm-up steps that build primitives and fill the allocator) and reports items per second plus
// each op kind's ms per step (executor profiling) as counters.
#pragma once
#include <benchmark/benchmark.h>

#include <string>

#include "model/executor.h"

namespace ft::bench {

inline void run_profiled_steps(benchmark::State& state, Executor& executor, ParamStore& params,
                               Workspace& ws, double items_per_step, const std::string& unit) {
  for (int i = 0; i < 2; ++i) {
    executor.forward(ws);
    executor.backward(ws);
  }
  executor.set_profiling(true);
  for (auto _ : state) {
    params.zero_grads();
    executor.forward(ws);
    executor.backward(ws);
  }
  state.counters[unit + "/s"] =
      benchmark::Counter(items_per_step * state.iterations(), benchmark::Counter::kIsRate);
  const double steps = static_cast<double>(state.iterations());
  for (const auto& [op, entry] : executor.op_times().entries())
    state.counters[op] = benchmark::Counter(entry.total_ms / steps);
}

}  // namespace ft::bench
