// Per-op profiler behind `train.profile`: an OpObserver on the training executor that, after a
// warm-up, adds up each op's calls and wall time (forward and backward apart) together with the
// measured step times, so that the op rows plus one "outside ops" row (batch loading, gradient
// zeroing, clipping, the optimizer, exposed communication, the executor's own bookkeeping) add
// up to the step. app/jobs/train_job.cpp prints the top ops on rank 0 and writes the whole table
// into the --json file; app/analysis/fusion_advice.h turns it into fusion advice. Thread safety:
// one thread (the executor's) drives a Profiler.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/executor.h"
#include "model/graph.h"

namespace ft {

// Steps skipped before measuring: the first ones pay for page faults on fresh buffers, oneDNN
// primitive creation and cold caches.
inline constexpr int kProfileWarmupSteps = 3;

struct OpTimes {
  int64_t count = 0;  // calls: measured steps x micro-batches
  double total_ms = 0;
  double mean_ms() const { return count > 0 ? total_ms / static_cast<double>(count) : 0.0; }
};

// One op of the executed graph.
struct ProfileOp {
  int op_index = 0;  // position in graph.ops
  std::string name;
  OpKind kind = OpKind::kOther;
  OpTimes forward, backward;
  std::string runtime_choice;  // Op::runtime_choice() as last seen
  double total_ms() const { return forward.total_ms + backward.total_ms; }
};

struct Profile {
  int warmup_steps = 0;
  int steps = 0;               // measured steps
  double step_ms = 0;          // sum of the measured steps' times
  std::vector<ProfileOp> ops;  // graph order, one per op of the graph

  double forward_ms() const;
  double backward_ms() const;
  double op_ms() const { return forward_ms() + backward_ms(); }
  // The part of the step no op accounts for.
  double outside_ms() const { return step_ms - op_ms(); }
  // Fraction of the measured step time.
  double share(double ms) const { return step_ms > 0 ? ms / step_ms : 0.0; }
};

class Profiler : public OpObserver {
 public:
  // Measures every step after the first `warmup_steps`. Ops reported outside begin_step() /
  // end_step() (evaluation uses its own executor, but a caller may run this one) are ignored.
  // REQUIRES: `graph` is the observed executor's graph and outlives the profiler. (A timeline
  // trace holding the executor's observer slot passes the ops on: app/training/trace.h
  // also_observe.)
  Profiler(const Graph& graph, int warmup_steps);

  void begin_step();
  // `step_ms`: the step's wall time as the trainer measured it (StepStats::step_ms).
  void end_step(double step_ms);
  void on_op(const Op& op, int op_index, bool backward, double start_ms, double end_ms) override;

  const Profile& profile() const { return profile_; }

 private:
  Profile profile_;
  int steps_seen_ = 0;
  bool measuring_ = false;
};

// The fixed cost the executor adds to every op, in ms: the median time an observer sees for an
// op that does no work except open one OpenMP parallel region (every kernel opens at least one)
// at the current thread count, over `repeats` forward and backward calls.
double measure_dispatch_ms(int repeats = 400);

// The ops of one kind together.
struct KindTotals {
  OpKind kind = OpKind::kOther;
  int ops = 0;
  OpTimes forward, backward;
  std::string runtime_choice;  // Op::runtime_choice() as last seen
  double total_ms() const { return forward.total_ms + backward.total_ms; }
};
// One row per op kind of the profile, by forward + backward time, longest first.
std::vector<KindTotals> kind_totals(const Profile& profile);

// Text report: the top `top` ops by forward + backward time, per-kind totals, and the step
// totals with the "outside ops" row, each with count, total ms, mean ms and share of the step.
std::string format_profile(const Profile& profile, int top = 15);

// The whole table: {"warmup_steps", "steps", "step_ms_total", "step_ms" (per step),
// "forward_share", "backward_share", "outside_ops": {total_ms, ms_per_step, share}, "ops": [one
// per op in graph order: index, name, kind, forward and backward {count, total_ms, mean_ms,
// share}], "kinds": [the same per kind]}. Totals are over the measured steps.
nlohmann::json profile_json(const Profile& profile);

}  // namespace ft
