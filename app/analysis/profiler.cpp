#include "app/analysis/profiler.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <map>

#include "core/check.h"
#include "core/timer.h"
#include "model/params.h"

namespace ft {

double Profile::forward_ms() const {
  double sum = 0;
  for (const ProfileOp& op : ops) sum += op.forward.total_ms;
  return sum;
}

double Profile::backward_ms() const {
  double sum = 0;
  for (const ProfileOp& op : ops) sum += op.backward.total_ms;
  return sum;
}

Profiler::Profiler(const Graph& graph, int warmup_steps) {
  FT_CHECK(warmup_steps >= 0, "profiler warm-up must be >= 0 steps, got ", warmup_steps);
  profile_.warmup_steps = warmup_steps;
  profile_.ops.resize(graph.ops.size());
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    profile_.ops[i].op_index = static_cast<int>(i);
    profile_.ops[i].name = graph.ops[i]->name;
    profile_.ops[i].kind = graph.ops[i]->op_kind();
  }
}

void Profiler::begin_step() {
  FT_CHECK(!measuring_, "Profiler::begin_step called twice without end_step");
  measuring_ = steps_seen_ >= profile_.warmup_steps;
}

void Profiler::end_step(double step_ms) {
  if (measuring_) {
    ++profile_.steps;
    profile_.step_ms += step_ms;
  }
  measuring_ = false;
  ++steps_seen_;
}

void Profiler::on_op(const Op& op, int op_index, bool backward, double start_ms, double end_ms) {
  if (measuring_) {
    FT_CHECK(op_index >= 0 && op_index < static_cast<int>(profile_.ops.size()),
             "profiler saw op index ", op_index, " of a graph with ", profile_.ops.size(),
             " ops: it observes an executor of another graph");
    ProfileOp& profiled = profile_.ops[op_index];
    OpTimes& times = backward ? profiled.backward : profiled.forward;
    ++times.count;
    times.total_ms += end_ms - start_ms;
    // Measured choices are made in the first (warm-up) steps, so by now they are final.
    if (backward && profiled.runtime_choice.empty()) profiled.runtime_choice = op.runtime_choice();
  }
}

namespace {

// Does no work but open one parallel region: what every kernel pays before its first flop.
class DispatchProbeOp : public Op {
 public:
  OpKind op_kind() const override { return OpKind::kOther; }
  void forward(Workspace&, ParamStore&) override { open_parallel_region(); }
  void backward(Workspace&, ParamStore&) override { open_parallel_region(); }

 private:
  static void open_parallel_region() {
#pragma omp parallel
    {}
  }
};

class DurationRecorder : public OpObserver {
 public:
  void on_op(const Op&, int, bool, double start_ms, double end_ms) override {
    durations.push_back(end_ms - start_ms);
  }
  std::vector<double> durations;
};

}  // namespace

double measure_dispatch_ms(int repeats) {
  FT_CHECK(repeats > 0, "measure_dispatch_ms needs repeats > 0, got ", repeats);
  Graph graph;
  const ValueId loss = graph.add_value("loss", {1});
  graph.output = graph.loss = loss;
  graph.add_op<DispatchProbeOp>("dispatch_probe", {}, {loss}, {});
  ParamStore params;
  params.allocate();
  Executor executor(graph, params);
  Workspace ws = executor.make_workspace();
  DurationRecorder recorder;
  executor.set_observer(&recorder);
  for (int i = 0; i < repeats; ++i) {
    executor.forward(ws);
    executor.backward(ws);
  }
  std::vector<double>& durations = recorder.durations;
  std::nth_element(durations.begin(), durations.begin() + durations.size() / 2, durations.end());
  return durations[durations.size() / 2];
}

namespace {

nlohmann::json times_json(const OpTimes& times, const Profile& profile) {
  return {{"count", times.count},
          {"total_ms", times.total_ms},
          {"mean_ms", times.mean_ms()},
          {"share", profile.share(times.total_ms)}};
}

void append(std::string& text, const char* format, ...) __attribute__((format(printf, 2, 3)));
void append(std::string& text, const char* format, ...) {
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  text += line;
}

// Calls, ms per measured step, mean ms per call, share of the step.
void append_times(std::string& text, const OpTimes& times, const Profile& profile) {
  append(text, " %6lld %8.3f %8.4f %6.1f%%", static_cast<long long>(times.count),
         times.total_ms / profile.steps, times.mean_ms(), 100.0 * profile.share(times.total_ms));
}

void append_header(std::string& text, const char* first_column, const char* second_column) {
  append(text, "  %-28s %-20s | %-32s | %s\n", "", "", "forward", "backward");
  append(text, "  %-28s %-20s |", first_column, second_column);
  for (int direction = 0; direction < 2; ++direction)
    append(text, "%s %6s %8s %8s %7s", direction == 0 ? "" : " |", "calls", "ms/step", "ms/call",
           "share");
  text += "\n";
}

}  // namespace

std::vector<KindTotals> kind_totals(const Profile& profile) {
  std::map<OpKind, KindTotals> by_kind;
  for (const ProfileOp& op : profile.ops) {
    KindTotals& totals = by_kind[op.kind];
    totals.kind = op.kind;
    ++totals.ops;
    totals.forward.count += op.forward.count;
    totals.forward.total_ms += op.forward.total_ms;
    totals.backward.count += op.backward.count;
    totals.backward.total_ms += op.backward.total_ms;
  }
  std::vector<KindTotals> rows;
  for (const auto& entry : by_kind) rows.push_back(entry.second);
  std::sort(rows.begin(), rows.end(),
            [](const KindTotals& a, const KindTotals& b) { return a.total_ms() > b.total_ms(); });
  return rows;
}

std::string format_profile(const Profile& profile, int top) {
  std::string text;
  if (profile.steps == 0) {
    append(text, "profile: no step measured (the run had at most %d warm-up steps)\n",
           profile.warmup_steps);
    return text;
  }
  append(text,
         "profile: %d steps after %d warm-up, %.3f ms/step: forward ops %.1f%%, backward ops "
         "%.1f%%, outside ops %.1f%%\n",
         profile.steps, profile.warmup_steps, profile.step_ms / profile.steps,
         100.0 * profile.share(profile.forward_ms()), 100.0 * profile.share(profile.backward_ms()),
         100.0 * profile.share(profile.outside_ms()));
  std::vector<const ProfileOp*> ranked;
  for (const ProfileOp& op : profile.ops) ranked.push_back(&op);
  std::stable_sort(ranked.begin(), ranked.end(), [](const ProfileOp* a, const ProfileOp* b) {
    return a->total_ms() > b->total_ms();
  });
  const int shown = std::min<int>(top, static_cast<int>(ranked.size()));
  append(text, "top %d of %zu ops by forward + backward time (ms/step: per measured step)\n", shown,
         ranked.size());
  append_header(text, "op", "kind");
  for (int i = 0; i < shown; ++i) {
    append(text, "  %-28s %-20s |", ranked[i]->name.c_str(), op_kind_name(ranked[i]->kind));
    append_times(text, ranked[i]->forward, profile);
    text += " |";
    append_times(text, ranked[i]->backward, profile);
    text += "\n";
  }
  text += "by kind\n";
  append_header(text, "kind", "ops");
  for (const KindTotals& row : kind_totals(profile)) {
    append(text, "  %-28s %-20d |", op_kind_name(row.kind), row.ops);
    append_times(text, row.forward, profile);
    text += " |";
    append_times(text, row.backward, profile);
    text += "\n";
  }
  append(text, "  %-28s %-20s | %6d %8.3f %8s %6.1f%%   (optimizer, clipping, zeroing, comm)\n",
         "outside ops", "-", profile.steps, profile.outside_ms() / profile.steps, "-",
         100.0 * profile.share(profile.outside_ms()));
  bool any_choice = false;
  for (const ProfileOp& op : profile.ops) {
    if (op.runtime_choice.empty()) continue;
    if (!any_choice) text += "chosen by measurement (fastest first)\n";
    any_choice = true;
    append(text, "  %-28s %s\n", op.name.c_str(), op.runtime_choice.c_str());
  }
  return text;
}

nlohmann::json profile_json(const Profile& profile) {
  nlohmann::json ops = nlohmann::json::array();
  for (const ProfileOp& op : profile.ops) {
    ops.push_back({{"index", op.op_index},
                   {"name", op.name},
                   {"kind", op_kind_name(op.kind)},
                   {"forward", times_json(op.forward, profile)},
                   {"backward", times_json(op.backward, profile)}});
    if (!op.runtime_choice.empty()) ops.back()["runtime_choice"] = op.runtime_choice;
  }
  nlohmann::json kinds = nlohmann::json::array();
  for (const KindTotals& row : kind_totals(profile))
    kinds.push_back({{"kind", op_kind_name(row.kind)},
                     {"ops", row.ops},
                     {"forward", times_json(row.forward, profile)},
                     {"backward", times_json(row.backward, profile)}});
  const double steps = std::max(1, profile.steps);
  return {{"warmup_steps", profile.warmup_steps},
          {"steps", profile.steps},
          {"step_ms_total", profile.step_ms},
          {"step_ms", profile.step_ms / steps},
          {"forward_share", profile.share(profile.forward_ms())},
          {"backward_share", profile.share(profile.backward_ms())},
          {"outside_ops",
           {{"total_ms", profile.outside_ms()},
            {"ms_per_step", profile.outside_ms() / steps},
            {"share", profile.share(profile.outside_ms())}}},
          {"ops", ops},
          {"kinds", kinds}};
}

}  // namespace ft
