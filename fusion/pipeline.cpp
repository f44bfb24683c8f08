#include "fusion/pipeline.h"

#include "core/check.h"
#include "fusion/passes.h"
#include "model/graph_edit.h"

namespace ft {

FusionPipeline FusionPipeline::standard() {
  FusionPipeline pipeline;
  for (auto make :
       {make_fold_bn_pass, make_qkv_pass, make_batched_layernorm_pass, make_conv_shortcut_pass,
        make_attention_pass, make_gemm_epilogue_pass, make_residual_layernorm_pass,
        make_classifier_pass, make_bn_relu_pass, make_cast_pass}) {
    std::unique_ptr<FusionPass> pass = make();
    if (pass) pipeline.add(std::move(pass));
  }
  return pipeline;
}

FusionResult FusionPipeline::run(Graph& graph, const ParamStore& params,
                                 const FusionOptions& options) const {
  FusionResult result;
  validate(graph);
  PassContext context{options, params, result.decisions};
  for (const auto& pass : passes_) {
    PassReport report;
    report.pass = pass->name();
    report.enabled = options.enabled && pass->enabled(options);
    report.ops_before = report.ops_after = graph.ops.size();
    if (report.enabled) {
      report.rewrites = pass->apply(graph, context);
      try {
        validate(graph);
      } catch (const Error& error) {
        FT_FAIL("fusion pass '", pass->name(), "' left an invalid graph: ", error.what());
      }
      report.ops_after = graph.ops.size();
    }
    result.passes.push_back(report);
  }
  remove_dead_values(graph);
  validate(graph);
  return result;
}

}  // namespace ft
