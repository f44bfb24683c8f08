// Per-kind forward totals of an inference model (see inference_profile.h).
#include "app/inference/inference_profile.h"

#include <cstdio>

namespace ft {

InferenceProfile::InferenceProfile(Executor& executor, const Graph& graph)
    : executor_(executor), profiler_(graph, 0) {
  executor_.set_observer(&profiler_);
}

InferenceProfile::~InferenceProfile() {
  executor_.set_observer(nullptr);
}

std::string InferenceProfile::format(const char* label) const {
  const Profile& profile = profiler_.profile();
  char line[256];
  if (profile.steps == 0) {
    std::snprintf(line, sizeof(line), "profile %s: no batch of the full size was timed\n", label);
    return line;
  }
  const double batches = profile.steps;
  std::snprintf(line, sizeof(line), "profile %s: %d batches, %.4f ms/batch: ops %.1f%%\n", label,
                profile.steps, profile.step_ms / batches, 100.0 * profile.share(profile.op_ms()));
  std::string text = line;
  for (const KindTotals& row : kind_totals(profile)) {
    std::snprintf(line, sizeof(line), "  %-24s %3d ops %10.4f ms/batch %6.1f%%\n",
                  op_kind_name(row.kind), row.ops, row.forward.total_ms / batches,
                  100.0 * profile.share(row.forward.total_ms));
    text += line;
  }
  std::snprintf(line, sizeof(line),
                "  %-24s %7s %10.4f ms/batch %6.1f%%   (images in, logits out)\n", "outside ops",
                "-", profile.outside_ms() / batches, 100.0 * profile.share(profile.outside_ms()));
  return text + line;
}

}  // namespace ft
