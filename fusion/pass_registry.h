// PassRegistry: the data half of the fusion pipeline, an ordered list of PassInfo (one per pass
// and per switch that rewrites no graph, such as fusion.horizontal.multi_tensor). Everything that
// only lists pass keys reads one: the config schema, bench's variants and --ablation keys, tune
// and fusion advice. It holds no pass, so they link without the passes and the engine behind them
// (the fuzz build links only fusion/pass.cpp, pass_infos.cpp and pass_registry.cpp).
// standard() is the standard pipeline's keys in run order, expanded from fusion/standard_passes.def
// as FusionPipeline::standard() (fusion/pipeline.h) expands its passes, and checked against it.
// A FusionPipeline holds a registry of its own entries, so a test's pipeline with a pass of its
// own hands its registry to the same consumers.
// Thread safety: standard() is built once (function-local static) and read-only afterwards; add()
// must not race with readers.
#pragma once
#include <string>
#include <vector>

#include "fusion/pass.h"

namespace ft {

class PassRegistry {
 public:
  // Every PassInfo of fusion/pass_infos.h, in the order the standard pipeline runs them; built
  // once. Adding a pass to it is one line in fusion/standard_passes.def.
  static const PassRegistry& standard();

  // Appends `info`. Throws ft::Error when its key is already listed, or when an entry already
  // listed must run after it (PassInfo::after): the list would run them the wrong way.
  // REQUIRES: `info` outlives the registry (a function-local static).
  void add(const PassInfo& info);
  // Throws ft::Error when a name in some entry's PassInfo::after is no entry of the registry: in
  // a complete list (standard()) that is a typo, not a pass left out.
  void check_after_names() const;

  // Every pass and switch, in list order.
  const std::vector<const PassInfo*>& entries() const { return entries_; }
  // The keys of `family`, in list order: "fusion.vertical.gemm_epilogue", ...
  std::vector<std::string> keys(PassFamily family) const;
  const PassInfo* find_key(const std::string& key) const;  // nullptr if not listed

 private:
  std::vector<const PassInfo*> entries_;  // not owned
};

}  // namespace ft
