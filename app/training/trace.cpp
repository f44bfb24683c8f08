#include "app/training/trace.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "app/training/trainer.h"
#include "comm/gather.h"
#include "core/atomic_file.h"
#include "core/timer.h"

namespace ft {
namespace {

constexpr int kStepsTrack = 0;
constexpr int kComputeTrack = 1;
constexpr int kCommTrack = 2;
constexpr int kFirstTracedStep = 4;  // steps 1..3 warm up caches, the allocator and MPI
constexpr int kTracedSteps = 3;

nlohmann::json metadata(int rank, int tid, const char* what, const std::string& name) {
  return {{"ph", "M"}, {"pid", rank}, {"tid", tid}, {"name", what}, {"args", {{"name", name}}}};
}

}  // namespace

TraceWindow trace_window(int done_steps, int total_steps) {
  const int steps_run = std::max(0, total_steps - done_steps);
  TraceWindow window;
  window.first = done_steps + std::max(1, std::min(kFirstTracedStep, steps_run - kTracedSteps + 1));
  window.last = std::min(total_steps, window.first + kTracedSteps - 1);
  return window;
}

TraceRecorder::TraceRecorder(int rank, double zero_ms) : rank_(rank), zero_ms_(zero_ms) {
  events_.push_back(metadata(rank, 0, "process_name", "rank " + std::to_string(rank)));
  events_.push_back({{"ph", "M"},
                     {"pid", rank},
                     {"tid", 0},
                     {"name", "process_sort_index"},
                     {"args", {{"sort_index", rank}}}});
  events_.push_back(metadata(rank, kStepsTrack, "thread_name", "steps"));
  events_.push_back(metadata(rank, kComputeTrack, "thread_name", "compute"));
  events_.push_back(metadata(rank, kCommTrack, "thread_name", "comm"));
}

void TraceRecorder::add_complete(int tid, const std::string& name, const char* category,
                                 double start_ms, double end_ms, nlohmann::json args) {
  events_.push_back({{"ph", "X"},
                     {"pid", rank_},
                     {"tid", tid},
                     {"name", name},
                     {"cat", category},
                     {"ts", to_us(start_ms)},
                     {"dur", (end_ms - start_ms) * 1e3},
                     {"args", std::move(args)}});
}

void TraceRecorder::begin_step(int step) {
  in_step_ = true;
  step_ = step;
  step_start_ms_ = now_ms();
}

void TraceRecorder::on_op(const Op& op, int op_index, bool backward, double start_ms,
                          double end_ms) {
  if (in_step_) {
    add_complete(kComputeTrack, op.name, backward ? "backward" : "forward", start_ms, end_ms,
                 {{"kind", op.kind()}, {"op_index", op_index}, {"step", step_}});
  }
  if (next_) next_->on_op(op, op_index, backward, start_ms, end_ms);
}

void TraceRecorder::end_step(const CommStepStats& comm) {
  const double end_ms = now_ms();
  in_step_ = false;
  for (const BucketTiming& timing : comm.bucket_timings) {
    const std::string name = "allreduce bucket " + std::to_string(timing.bucket);
    // The launch instant shows how long a bucket queued behind earlier ones on the comm thread;
    // the slice itself is the allreduce, so slices on the comm track never overlap.
    events_.push_back({{"ph", "i"},
                       {"s", "t"},
                       {"pid", rank_},
                       {"tid", kCommTrack},
                       {"name", "launch bucket " + std::to_string(timing.bucket)},
                       {"cat", "comm"},
                       {"ts", to_us(timing.launch_ms)},
                       {"args", {{"bucket", timing.bucket}, {"step", step_}}}});
    add_complete(kCommTrack, name, "comm", timing.start_ms, timing.done_ms,
                 {{"bucket", timing.bucket},
                  {"bytes", timing.bytes},
                  {"step", step_},
                  {"launch_us", to_us(timing.launch_ms)},
                  {"queued_us", (timing.start_ms - timing.launch_ms) * 1e3}});
  }
  add_complete(kStepsTrack, "step " + std::to_string(step_), "step", step_start_ms_, end_ms,
               {{"step", step_},
                {"buckets", comm.bucket_bytes.size()},
                {"comm_ms", comm.comm_ms},
                {"exposed_comm_ms", comm.exposed_ms}});
}

double shared_trace_zero_ms(Communicator* comm) {
  if (comm == nullptr || comm->size() == 1) return now_ms();
  return shared_clock_zero_ms(*comm);
}

size_t write_trace(Communicator* comm, const TraceRecorder& recorder, const std::string& path,
                   const nlohmann::json& other_data) {
  nlohmann::json events = nlohmann::json::array();
  if (comm == nullptr || comm->size() == 1) {
    events = recorder.events();
  } else {
    const std::vector<std::string> per_rank = gather_strings(*comm, recorder.events().dump(), 0);
    if (comm->rank() != 0) return 0;
    for (const std::string& text : per_rank) {
      for (nlohmann::json& event : nlohmann::json::parse(text)) events.push_back(std::move(event));
    }
  }
  const size_t count = events.size();
  const nlohmann::json trace = {
      {"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", other_data}};
  write_file_atomic(path, trace.dump());
  return count;
}

TrainTrace::TrainTrace(const std::string& path, Trainer& trainer, Communicator* comm,
                       OpObserver* also_observe)
    : path_(path),
      trainer_(trainer),
      comm_(comm),
      also_observe_(also_observe),
      window_(trace_window(trainer.step(), trainer.config().train.steps)),
      recorder_(comm ? comm->rank() : 0, path.empty() ? 0.0 : shared_trace_zero_ms(comm)) {
  recorder_.set_next(also_observe);
}

TrainTrace::~TrainTrace() {
  if (active_) trainer_.executor().set_observer(also_observe_);
}

void TrainTrace::before_step() {
  const int step = trainer_.step() + 1;
  if (path_.empty() || !window_.contains(step)) return;
  active_ = true;
  recorder_.begin_step(step);
  trainer_.executor().set_observer(&recorder_);
  if (GradSync* sync = trainer_.grad_sync()) sync->set_record_timings(true);
}

void TrainTrace::after_step(const CommStepStats& comm) {
  if (!active_) return;
  active_ = false;
  recorder_.end_step(comm);
  trainer_.executor().set_observer(also_observe_);
  if (GradSync* sync = trainer_.grad_sync()) sync->set_record_timings(false);
  if (trainer_.step() != window_.last) return;
  const Config& config = trainer_.config();
  const nlohmann::json other_data = {{"first_step", window_.first},
                                     {"last_step", window_.last},
                                     {"world_size", comm_ ? comm_->size() : 1},
                                     {"comm.bucketing", config.comm.bucketing},
                                     {"comm.overlap", config.comm.overlap},
                                     {"comm.bucket_mb", config.comm.bucket_mb},
                                     {"fusion.enabled", config.fusion.enabled}};
  const size_t count = write_trace(comm_, recorder_, path_, other_data);
  if (comm_ == nullptr || comm_->rank() == 0) {
    std::printf("trace: %zu events of steps %d-%d on %d rank(s) written to %s\n", count,
                window_.first, window_.last, comm_ ? comm_->size() : 1, path_.c_str());
    std::fflush(stdout);
  }
}

}  // namespace ft
