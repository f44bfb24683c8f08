// Shared checks of a timeline trace file (app/training/trace.h) for tests/trace_test.cpp and
// tests/mpi_trace_test.cpp: parsing, grouping by rank, track and step, and the invariants every
// trace must hold whatever the rank count.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/atomic_file.h"

namespace ft {

inline constexpr int kStepsTid = 0;
inline constexpr int kComputeTid = 1;
inline constexpr int kCommTid = 2;
// Microseconds of slack for comparing times that went through a double's decimal round trip.
inline constexpr double kSlackUs = 1e-3;

struct Slice {
  std::string name, cat;
  int pid = 0, tid = 0, step = 0;
  double ts = 0, dur = 0;
  nlohmann::json args;
  double end() const { return ts + dur; }
};

// Complete ("X") events by pid, then tid, in time order.
using SlicesByTrack = std::map<int, std::map<int, std::vector<Slice>>>;

inline SlicesByTrack load_slices(const nlohmann::json& trace) {
  SlicesByTrack tracks;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    EXPECT_TRUE(event.contains("ph") && event.contains("pid") && event.contains("name"))
        << event.dump();
    if (event.value("ph", "") != "X") continue;
    Slice slice;
    slice.name = event.at("name").get<std::string>();
    slice.cat = event.at("cat").get<std::string>();
    slice.pid = event.at("pid").get<int>();
    slice.tid = event.at("tid").get<int>();
    slice.ts = event.at("ts").get<double>();
    slice.dur = event.at("dur").get<double>();
    slice.args = event.at("args");
    slice.step = slice.args.at("step").get<int>();
    EXPECT_GE(slice.dur, 0.0) << event.dump();
    tracks[slice.pid][slice.tid].push_back(slice);
  }
  for (auto& [pid, by_tid] : tracks) {
    for (auto& [tid, slices] : by_tid) {
      std::stable_sort(slices.begin(), slices.end(),
                       [](const Slice& a, const Slice& b) { return a.ts < b.ts; });
    }
  }
  return tracks;
}

inline nlohmann::json load_trace(const std::string& path) {
  return nlohmann::json::parse(read_file(path));  // throws on invalid JSON
}

// Every slice lies inside the step slice of its own rank and step; slices of one track never
// overlap; each rank has exactly the steps first..last.
inline void expect_well_formed(const SlicesByTrack& tracks, int first_step, int last_step) {
  for (const auto& [pid, by_tid] : tracks) {
    SCOPED_TRACE("rank " + std::to_string(pid));
    ASSERT_TRUE(by_tid.count(kStepsTid));
    std::map<int, Slice> steps;
    for (const Slice& step : by_tid.at(kStepsTid)) steps[step.step] = step;
    ASSERT_EQ(static_cast<int>(steps.size()), last_step - first_step + 1);
    EXPECT_EQ(steps.begin()->first, first_step);
    EXPECT_EQ(steps.rbegin()->first, last_step);
    for (const auto& [tid, slices] : by_tid) {
      for (size_t i = 0; i < slices.size(); ++i) {
        const Slice& slice = slices[i];
        ASSERT_TRUE(steps.count(slice.step)) << slice.name << " in untraced step " << slice.step;
        const Slice& step = steps.at(slice.step);
        EXPECT_GE(slice.ts, step.ts - kSlackUs) << slice.name << " starts before its step";
        EXPECT_LE(slice.end(), step.end() + kSlackUs) << slice.name << " ends after its step";
        if (i > 0) {
          EXPECT_GE(slice.ts, slices[i - 1].end() - kSlackUs)
              << slice.name << " overlaps " << slices[i - 1].name << " on track " << tid;
        }
      }
    }
  }
}

// The slices of one rank's track in one step.
inline std::vector<Slice> in_step(const std::vector<Slice>& slices, int step) {
  std::vector<Slice> selected;
  for (const Slice& slice : slices) {
    if (slice.step == step) selected.push_back(slice);
  }
  return selected;
}

}  // namespace ft
