// FusionPipeline: the ordered passes between model/ (which builds the eager op list) and the
// executor. Each pass is switched by its fusion.* key; after every pass the graph is validated,
// so a bad rewrite fails at the pass that made it. With fusion.enabled false no pass runs and
// the executed graph is exactly the built one.
// Thread safety: used by the training thread while building graphs.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "fusion/pass.h"
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
  // Every pass of fusion/passes.h, in order.
  static FusionPipeline standard();
  void add(std::unique_ptr<FusionPass> pass) { passes_.push_back(std::move(pass)); }
  // Runs the enabled passes (none when !options.enabled), validating after each, then drops dead
  // values. The graph is final afterwards: the executor derives its tables from it.
  FusionResult run(Graph& graph, const ParamStore& params, const FusionOptions& options) const;
  size_t size() const { return passes_.size(); }

 private:
  std::vector<std::unique_ptr<FusionPass>> passes_;
};

}  // namespace ft
