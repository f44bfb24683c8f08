// FusionPipeline: the ordered passes between model/ (which builds the eager op list) and the
// executor. Each pass is switched by its config key; after every pass the graph is validated,
// so a bad rewrite fails at the pass that made it. With fusion.enabled false no pass runs and
// the executed graph is exactly the built one.
// Beside its passes a pipeline holds their PassInfo (and those of switches that rewrite no graph,
// such as fusion.horizontal.multi_tensor) as a PassRegistry (fusion/pass_registry.h): what key
// listings read. standard() expands fusion/standard_passes.def, as PassRegistry::standard() does,
// and checks that the two agree entry for entry. Order constraints are declared by each pass
// (PassInfo::after) and checked as passes are added. Thread safety: used by the training thread
// while building graphs.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "fusion/pass.h"
#include "fusion/pass_registry.h"
#include "model/graph.h"

namespace ft {

struct PassReport {
  std::string pass;
  bool enabled = false;
  int rewrites = 0;
  size_t ops_before = 0, ops_after = 0;
};

struct FusionResult {
  std::vector<PassReport> passes;
  std::vector<FusionDecision> decisions;  // every candidate of every pass, in pass order
};

class FusionPipeline {
 public:
  // Every pass and switch of fusion/standard_passes.def, in its order. Throws ft::Error when that
  // list is not PassRegistry::standard()'s (check_entries), say a pass whose info() is a copy.
  static FusionPipeline standard();

  // Appends a pass. Throws ft::Error when its key is already listed, or when a pass already
  // listed must run after it (PassInfo::after): the list would run them the wrong way.
  void add(std::unique_ptr<FusionPass> pass);
  // Appends a key that switches something other than a graph rewrite. Same checks as add().
  // REQUIRES: `info` lives for the program (a function-local static).
  void add_switch(const PassInfo& info);

  // The PassInfo of every pass and switch, in list order: what bench, tune, fusion advice and the
  // config schema read to list this pipeline's keys.
  const PassRegistry& registry() const { return registry_; }
  // Throws ft::Error naming the first entry where this pipeline's list (passes and switches, in
  // order, each by its PassInfo object) differs from `expected`'s.
  void check_entries(const PassRegistry& expected) const;

  // Runs the enabled passes (none when !options.enabled), validating after each, then drops dead
  // values. The graph is final afterwards: the executor derives its tables from it.
  FusionResult run(Graph& graph, const ParamStore& params, const FusionOptions& options) const;
  size_t size() const { return passes_.size(); }  // graph passes; switches are not counted

 private:
  PassRegistry registry_;                            // passes and switches
  std::vector<std::unique_ptr<FusionPass>> passes_;  // in registry_'s order, switches left out
};

}  // namespace ft
