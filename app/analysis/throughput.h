// Throughput of a training step, as `train` logs it and `bench` reports it per variant: items
// (tokens or images) per second over all ranks, and model FLOPs per second per rank with their
// utilisation of a peak the user gives (MFU, as PaLM defines it: the FLOPs the model needs, here
// the eager graph's forward + backward from app/analysis/plan.h, not what fused or recomputing
// kernels do). Thread safety: pure functions.
#pragma once
#include <optional>
#include <string>

namespace ft {

struct StepThroughput {
  double items_per_s = 0;            // over all ranks
  double model_tflops_per_rank = 0;  // model FLOPs of one rank's step / step time
  std::optional<double> mfu;         // model_tflops_per_rank / peak; empty without a peak
};

// items_per_step: over all ranks and micro-batches; model_flops_per_rank: one rank's step;
// peak_tflops <= 0: no MFU. REQUIRES: step_ms > 0.
StepThroughput step_throughput(double items_per_step, double model_flops_per_rank, double step_ms,
                               double peak_tflops);

// "12.3k", "1.25M", "812".
std::string human_rate(double per_second);

// "12.3k tokens/s, 0.45 model TFLOP/s per rank (MFU 0.7% of 67 TFLOP/s)"; no MFU part without one.
std::string format_throughput(const StepThroughput& throughput, const std::string& unit,
                              double peak_tflops);

}  // namespace ft
