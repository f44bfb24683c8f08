// FusionPipeline: the ordered list of graph-rewriting passes between model/ (which builds the
// unfused op list) and the executor. Each fusion is one pass in fusion/, switched by a key in
// the config's `fusion` section, with its unfused twin being the graph the pass did not rewrite.
// No fusion pass has landed yet: the pipeline runs whatever passes it is given, in order, and
// reports what each one rewrote.
// Thread safety: used by the training thread while building graphs.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/graph.h"

namespace ft {

class FusionPass {
 public:
  virtual ~FusionPass() = default;
  virtual const char* name() const = 0;
  // Rewrites `graph` in place; returns how many op groups it fused. Parameter storage is never
  // changed by a pass, so checkpoints move freely between fused and unfused runs.
  virtual int apply(Graph& graph, const ParamStore& params) = 0;
};

struct PassReport {
  std::string pass;
  int rewrites = 0;
  size_t ops_before = 0, ops_after = 0;
};

class FusionPipeline {
 public:
  void add(std::unique_ptr<FusionPass> pass) { passes_.push_back(std::move(pass)); }
  std::vector<PassReport> run(Graph& graph, const ParamStore& params) const;
  size_t size() const { return passes_.size(); }

 private:
  std::vector<std::unique_ptr<FusionPass>> passes_;
};

}  // namespace ft
