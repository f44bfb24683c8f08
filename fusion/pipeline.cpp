#include "fusion/pipeline.h"

#include <algorithm>
#include <set>

#include "core/check.h"
#include "fusion/pass_infos.h"
#include "fusion/passes.h"
#include "model/graph_edit.h"

namespace ft {
namespace {

// "'gemm_epilogue' (fusion.vertical.gemm_epilogue)", or "nothing" past the end of `entries`.
std::string describe_entry(const std::vector<const PassInfo*>& entries, size_t i) {
  if (i >= entries.size()) return "nothing";
  return "'" + std::string(entries[i]->name) + "' (" + entries[i]->key() + ")";
}

std::set<OpKind> kinds_in(const Graph& graph) {
  std::set<OpKind> kinds;
  for (const auto& op : graph.ops) kinds.insert(op->op_kind());
  return kinds;
}

// Throws when `pass` left an op of a kind that was not in the graph before and that its
// PassInfo::creates does not declare.
void check_created_kinds(const PassInfo& info, const std::set<OpKind>& before, const Graph& graph) {
  for (OpKind kind : kinds_in(graph))
    if (!before.count(kind) &&
        std::find(info.creates.begin(), info.creates.end(), kind) == info.creates.end())
      FT_FAIL("fusion pass '", info.name, "' created a ", op_kind_name(kind),
              " op, which its PassInfo::creates does not list");
}

}  // namespace

// fusion/standard_passes.def's passes and switches, in its order. check_entries() holds the
// result to PassRegistry::standard(), which expands the same list: a pass whose info() returns
// some other PassInfo than its fusion/pass_infos.h entry fails here.
FusionPipeline FusionPipeline::standard() {
  FusionPipeline pipeline;
#define FT_PASS(name) pipeline.add(make_##name##_pass());
#define FT_SWITCH(name) pipeline.add_switch(name##_info());
#include "fusion/standard_passes.def"
#undef FT_SWITCH
#undef FT_PASS
  pipeline.check_entries(PassRegistry::standard());
  return pipeline;
}

void FusionPipeline::add(std::unique_ptr<FusionPass> pass) {
  FT_CHECK(pass != nullptr, "FusionPipeline::add: no pass");
  registry_.add(pass->info());
  passes_.push_back(std::move(pass));
}

void FusionPipeline::add_switch(const PassInfo& info) {
  registry_.add(info);
}

void FusionPipeline::check_entries(const PassRegistry& expected) const {
  const std::vector<const PassInfo*>& ours = registry_.entries();
  const std::vector<const PassInfo*>& theirs = expected.entries();
  for (size_t i = 0; i < std::max(ours.size(), theirs.size()); ++i)
    FT_CHECK(i < ours.size() && i < theirs.size() && ours[i] == theirs[i],
             "fusion pipeline and pass registry differ at entry ", i, ": the pipeline has ",
             describe_entry(ours, i), " where the registry has ", describe_entry(theirs, i),
             (i < ours.size() && i < theirs.size() && ours[i]->key() == theirs[i]->key()
                  ? " (another PassInfo object of the same key: a pass's info() must return its "
                    "fusion/pass_infos.h entry)"
                  : ""),
             "; a pipeline standing for the standard one must list fusion/standard_passes.def's "
             "entries in its order");
}

FusionResult FusionPipeline::run(Graph& graph, const ParamStore& params,
                                 const FusionOptions& options) const {
  FusionResult result;
  validate(graph);
  PassContext context{options, params, result.decisions};
  for (const std::unique_ptr<FusionPass>& owned : passes_) {
    const FusionPass& pass = *owned;
    PassReport report;
    report.pass = pass.name();
    report.enabled = options.enabled && pass.enabled(options);
    report.ops_before = report.ops_after = graph.ops.size();
    if (report.enabled) {
      const std::set<OpKind> kinds_before = kinds_in(graph);
      report.rewrites = pass.apply(graph, context);
      try {
        validate(graph);
      } catch (const Error& error) {
        FT_FAIL("fusion pass '", pass.name(), "' left an invalid graph: ", error.what());
      }
      check_created_kinds(pass.info(), kinds_before, graph);
      report.ops_after = graph.ops.size();
    }
    result.passes.push_back(report);
  }
  remove_dead_values(graph);
  validate(graph);
  return result;
}

}  // namespace ft
