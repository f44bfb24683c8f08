// Fusion advice: the design documents' selection rules applied to a measured profile (app/
// profiler.h) of the executed graph, naming the fusion.* key that acts on each candidate and
// whether it is on (the keys and the edges and families each pass fuses come from the pass
// registry, fusion/pass_registry.h). A pure function of the graph, the profile and the options, so
// tests feed it any profile; app/jobs/train_job.cpp prints it after the profile table.
//   Horizontal: a family is >= 2 ops of one kind whose input and output value shapes are equal
//   (parameter shapes may differ: a 3x3 conv and its 1x1 shortcut) and none of which depends on
//   another. It is a candidate when the fixed per-op dispatch cost (measure_dispatch_ms) of its
//   calls exceeds `min_dispatch_share` of the family's measured time: one fused op pays it once.
//   Vertical: an op output that is not a graph result, has exactly one reader (views included)
//   and is larger than `min_intermediate_bytes`: fusing producer and consumer keeps it out of
//   memory (256 KiB: above a core's share of L2, so it makes a round trip to L3 or DRAM).
// Candidates of one pattern (same kinds, same shapes) are merged into one piece of advice.
// Thread safety: pure functions.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/analysis/profiler.h"
#include "fusion/pass.h"
#include "fusion/pass_registry.h"
#include "model/graph.h"

namespace ft {

struct AdviceOptions {
  double dispatch_ms = 0;                        // fixed cost per op call (measure_dispatch_ms())
  double min_dispatch_share = 0.2;               // horizontal rule threshold
  double min_intermediate_bytes = 256.0 * 1024;  // vertical rule threshold
};

enum class FusionDirection { kHorizontal, kVertical };

struct FusionAdvice {
  FusionDirection direction = FusionDirection::kVertical;
  std::string pattern;             // "linear -> gelu [1024,128]", "3 x linear [256,32]->[256,32]"
  std::vector<std::string> sites;  // vertical: "producer -> consumer"; horizontal: "a, b, c"
  std::string pass_key;            // "fusion.vertical.gemm_epilogue"; empty: no pass covers it
  bool key_on = false;             // the key's value in this config
  bool fusion_enabled = true;      // fusion.enabled in this config
  bool default_on = false;         // the key's value in the default config
  double ms_per_step = 0;          // measured forward + backward time of the ops involved
  double dispatch_share = 0;       // horizontal: dispatch cost / the family's time
  double intermediate_bytes = 0;   // vertical: size of the value that would stay in cache

  // Both the key and fusion.enabled are on.
  bool pass_on() const { return !pass_key.empty() && key_on && fusion_enabled; }
};

// REQUIRES: `profile` was taken on `graph` (one row per op, same order). Advice comes sorted:
// vertical by intermediate bytes, then horizontal by dispatch share, both descending. The keys
// named are those of `passes` (a test hands a registry with a pass of its own).
std::vector<FusionAdvice> advise_fusion(const Graph& graph, const Profile& profile,
                                        const FusionOptions& fusion, const AdviceOptions& options,
                                        const PassRegistry& passes = PassRegistry::standard());

// The pass of `passes` whose PassInfo::edges hold `producer` -> `consumer`, or null.
const PassInfo* vertical_advice_pass(const PassRegistry& passes, OpKind producer, OpKind consumer);
// The pass of `passes` whose PassInfo::families hold a family of `size` ops of `kind` (reading
// one input when `shares_input`), or null.
const PassInfo* horizontal_advice_pass(const PassRegistry& passes, OpKind kind, size_t size,
                                       bool shares_input);

// "vertical  linear -> gelu [1024,128] (2 sites, 0.84 ms/step, 512 KiB): fusion.vertical.
// gemm_epilogue is on in this config, but fusion.enabled is false".
std::string describe_advice(const FusionAdvice& advice);
std::string format_advice(const std::vector<FusionAdvice>& advice, const AdviceOptions& options);
nlohmann::json advice_json(const std::vector<FusionAdvice>& advice, const AdviceOptions& options);

}  // namespace ft
