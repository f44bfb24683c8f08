#include "fusion/pipeline.h"

namespace ft {

std::vector<PassReport> FusionPipeline::run(Graph& graph, const ParamStore& params) const {
  std::vector<PassReport> reports;
  for (const auto& pass : passes_) {
    PassReport report;
    report.pass = pass->name();
    report.ops_before = graph.ops.size();
    report.rewrites = pass->apply(graph, params);
    report.ops_after = graph.ops.size();
    reports.push_back(report);
  }
  return reports;
}

}  // namespace ft
