// `infer --profile`: where an inference model's time goes, per op kind, over the timed batches of
// the full batch size (a smaller last batch runs another graph and is left out). Built on the
// training profiler's Profiler (app/analysis/profiler.h), with each batch as one "step", so
// "outside ops" is the part of a batch no op accounts for: copying the images in and the logits
// out. Thread safety: one thread (the executor's) drives a profile.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/analysis/profiler.h"
#include "model/executor.h"

namespace ft {

class InferenceProfile {
 public:
  // Observes `executor` from now on. REQUIRES: `graph` is the executor's graph; both outlive
  // this profile, which detaches itself when destroyed.
  InferenceProfile(Executor& executor, const Graph& graph);
  ~InferenceProfile();
  InferenceProfile(const InferenceProfile&) = delete;
  InferenceProfile& operator=(const InferenceProfile&) = delete;

  void begin_batch() { profiler_.begin_step(); }
  void end_batch(double batch_ms) { profiler_.end_step(batch_ms); }

  // "profile folded: N batches, X ms/batch: ops Y%" then one row per op kind (ops, ms per batch,
  // share) by time, and the outside row.
  std::string format(const char* label) const;
  // profile_json's table (app/analysis/profiler.h), batches as its steps.
  nlohmann::json json() const { return profile_json(profiler_.profile()); }

 private:
  Executor& executor_;
  Profiler profiler_;
};

}  // namespace ft
