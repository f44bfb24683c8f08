// Timeline trace (`train.trace: FILE`): a Chrome trace-event JSON of a few training steps after
// warm-up, which opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Each rank is one
// process (pid = rank) with three tracks (tid): 0 "steps" (one slice per optimizer step),
// 1 "compute" (every forward and backward op, name = op name, cat = forward | backward,
// args.kind = OpKind), 2 "comm" (every gradient bucket's allreduce while it runs, with its bytes,
// plus an instant at the moment it was launched). Times are microseconds since a zero the ranks
// share, each on its own steady clock (offsets measured by ping-pong with rank 0).
// Thread safety: one training thread per rank drives a TrainTrace; write() is collective.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "comm/communicator.h"
#include "comm/grad_sync.h"
#include "model/executor.h"

namespace ft {

class Trainer;

// The 1-based optimizer steps to trace: steps 4..6 after the run's first step, or, in runs too
// short for that, the last (up to) three. Empty (first > last) when no step runs.
struct TraceWindow {
  int first = 1;
  int last = 0;
  bool contains(int step) const { return step >= first && step <= last; }
};
// `done_steps`: steps already taken when the run starts (a resume); `total_steps`: train.steps.
TraceWindow trace_window(int done_steps, int total_steps);

// Collects one rank's events. It is the executor's OpObserver; ops are kept only between
// begin_step() and end_step().
class TraceRecorder final : public OpObserver {
 public:
  // `zero_ms`: the now_ms() reading that becomes time 0 of the trace.
  TraceRecorder(int rank, double zero_ms);

  // Every op is also passed on to `next` (another observer, such as the profiler), recorded or
  // not. REQUIRES: next outlives this recorder, or is null.
  void set_next(OpObserver* next) { next_ = next; }

  void begin_step(int step);
  void on_op(const Op& op, int op_index, bool backward, double start_ms, double end_ms) override;
  // `comm`: the step's stats, whose bucket_timings become the comm track.
  void end_step(const CommStepStats& comm);

  // This rank's events, metadata (process and track names) first.
  const nlohmann::json& events() const { return events_; }

 private:
  double to_us(double ms) const { return (ms - zero_ms_) * 1e3; }
  void add_complete(int tid, const std::string& name, const char* category, double start_ms,
                    double end_ms, nlohmann::json args);

  int rank_;
  double zero_ms_;
  OpObserver* next_ = nullptr;
  bool in_step_ = false;
  int step_ = 0;
  double step_start_ms_ = 0;
  nlohmann::json events_ = nlohmann::json::array();
};

// Collective over `comm` (null = one process): a now_ms() value that marks the same instant on
// every rank (comm/gather.h shared_clock_zero_ms).
double shared_trace_zero_ms(Communicator* comm);

// Collective: gathers every rank's events onto rank 0, which writes {"traceEvents": [...],
// "displayTimeUnit": "ms", "otherData": other_data} to `path` atomically. Returns the number of
// events written on rank 0, 0 elsewhere.
size_t write_trace(Communicator* comm, const TraceRecorder& recorder, const std::string& path,
                   const nlohmann::json& other_data);

// `fusiontrain train`'s use of the above: picks the window, attaches the recorder to the
// trainer's executor and bucket timings for the traced steps only, and writes the file right
// after the window's last step. Does nothing when `path` is empty.
class TrainTrace {
 public:
  // Collective when path is set and comm is non-null (the shared zero). `also_observe` keeps
  // receiving every op while the trace holds the executor's observer slot (the profiler).
  // REQUIRES: trainer, comm and also_observe outlive this object.
  TrainTrace(const std::string& path, Trainer& trainer, Communicator* comm,
             OpObserver* also_observe = nullptr);
  ~TrainTrace();  // gives the observer slot back to `also_observe`; never throws
  TrainTrace(const TrainTrace&) = delete;
  TrainTrace& operator=(const TrainTrace&) = delete;

  // Around each Trainer::train_step(). after_step is collective on the window's last step.
  void before_step();
  void after_step(const CommStepStats& comm);

 private:
  std::string path_;
  Trainer& trainer_;
  Communicator* comm_;
  OpObserver* also_observe_;
  TraceWindow window_;
  TraceRecorder recorder_;
  bool active_ = false;  // inside a traced step
};

}  // namespace ft
