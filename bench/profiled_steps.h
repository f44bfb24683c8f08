// Shared by the benchmarks: FT_THREADS handling, and for the model benchmarks a timer of forward +
// backward steps of a ready executor (after two warm-up steps that build primitives and fill the
// allocator) that reports items per second plus each op kind's ms per step (executor profiling)
// as counters.
#pragma once
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdlib>
#include <string>

#include "model/executor.h"

namespace ft::bench {

// OpenMP threads from env FT_THREADS, default 1 (as the PyTorch reference was measured).
inline void set_threads_from_env() {
  const char* threads = std::getenv("FT_THREADS");
  omp_set_num_threads(threads ? std::atoi(threads) : 1);
}

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
