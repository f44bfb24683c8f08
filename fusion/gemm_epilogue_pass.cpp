// fusion.vertical.gemm_epilogue: LinearOp -> GeluOp (two eager ops and a [rows, out]
// pre-activation between them) becomes one LinearGeluOp (fusion/ops/linear_gelu.h). The unfused
// twin is the pair itself; tests/fusion_gemm_epilogue_test.cpp checks the two agree.
// A candidate is a Linear whose output some GELU reads. Train graphs get the row-tiled form,
// whose tile of pre-activation rows must fit fusion.tile_kb; eval graphs get oneDNN's GELU
// post-op, which keeps no intermediate.
// Order: none of its own (PassInfo::after is empty); cast runs after it, to make the row-tiled
// LinearGeluOp write bf16.
// Thread safety: stateless.
#include <algorithm>
#include <optional>
#include <string>

#include "fusion/ops/linear_gelu.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/linear.h"

namespace ft {
namespace {

const char* const kPass = gemm_epilogue_info().name;
constexpr int kChainOps = 2;

// The GELU fused into the Linear at `linear_index`, or the reason it cannot be.
struct EpilogueMatch {
  int gelu = -1;        // op index
  std::string refusal;  // empty when fusable
};

// The first GELU reading the output of the op at `op_index`; -1 if none (not a candidate).
int gelu_reader(const Graph& graph, const GraphIndex& index, int op_index) {
  for (int reader : index.consumers(graph.ops[op_index]->outputs[0]))
    if (graph.ops[reader]->op_kind() == OpKind::kGelu) return reader;
  return -1;
}

EpilogueMatch match_epilogue(const Graph& graph, const GraphIndex& index, int linear_index,
                             int gelu_index) {
  EpilogueMatch match;
  const ValueId pre = graph.ops[linear_index]->outputs[0];
  const std::string& name = graph.values[pre].name;
  const int readers = index.reader_count_with_views(pre);
  if (index.is_graph_result(pre))
    match.refusal = "output '" + name + "' is a graph result";
  else if (graph.values[pre].is_view())
    match.refusal = "output '" + name + "' is a column view";
  else if (readers != 1)
    match.refusal = "output has " + std::to_string(readers) + " consumers";
  else if (graph.ops[gelu_index]->inputs.size() != 1 ||
           graph.numel(graph.ops[gelu_index]->outputs[0]) != graph.numel(pre))
    match.refusal = "gelu '" + graph.ops[gelu_index]->name + "' does not map the whole output";
  else
    match.gelu = gelu_index;
  return match;
}

// "h.1.mlp.c_fc" -> "h.1.mlp.c_fc_gelu".
std::string fused_name(const std::string& linear_name) {
  return linear_name + "_gelu";
}

class GemmEpiloguePass : public CandidatePass {
 public:
  const PassInfo& info() const override { return gemm_epilogue_info(); }

 protected:
  bool is_candidate(const Op& op) const override { return op.op_kind() == OpKind::kLinear; }

  std::optional<Fusion> decide(const Graph& graph, const GraphIndex& index, int op_index,
                               PassContext& context) const override {
    const int gelu_index = gelu_reader(graph, index, op_index);
    if (gelu_index < 0) return std::nullopt;  // no GELU epilogue to fuse: not a candidate
    const std::string site = graph.ops[op_index]->name;
    const EpilogueMatch match = match_epilogue(graph, index, op_index, gelu_index);
    if (!match.refusal.empty()) {
      context.skipped(kPass, site, match.refusal);
      return std::nullopt;
    }
    if (!within_max_ops(context, kPass, site, kChainOps)) return std::nullopt;
    const auto& linear = static_cast<const LinearOp&>(*graph.ops[op_index]);
    const bool training = graph.mode == GraphMode::kTrain;
    const int64_t tile = rows_per_tile(context.options.tile_kb, linear.out_features());
    if (training && tile < 1) {
      context.skipped(kPass, site,
                      row_exceeds_tile(context.options.tile_kb, linear.out_features()));
      return std::nullopt;
    }
    const int tile_rows = static_cast<int>(std::max<int64_t>(1, std::min(tile, linear.rows())));
    Fusion fusion = fusion_like(linear);
    fusion.absorbed = {op_index, match.gelu};
    fusion.op = std::make_unique<LinearGeluOp>(
        linear.rows(), linear.in_features(), linear.out_features(), linear.has_bias(),
        linear.weight_row_offset(), tile_rows,
        training ? LinearGeluForward::kTiledKeepPreactivation : LinearGeluForward::kGeluPostOp);
    fusion.name = fused_name(site);
    fusion.outputs = graph.ops[match.gelu]->outputs;
    fusion.site = site;
    fusion.what = training
                      ? "linear+gelu -> linear_gelu (tile " + std::to_string(tile_rows) + " rows)"
                      : "linear+gelu -> linear_gelu (oneDNN gelu_tanh post-op)";
    return fusion;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_gemm_epilogue_pass() {
  return std::make_unique<GemmEpiloguePass>();
}

}  // namespace ft
