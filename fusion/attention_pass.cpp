// fusion.vertical.attention: AttentionScoresOp -> CausalSoftmaxOp -> AttentionMixOp (three eager
// ops, two [B, NH, T, T] intermediates) becomes one FlashAttentionOp that keeps only a [B, NH, T]
// log-sum-exp. The unfused twin is the chain itself (model/ops/attention_scores, causal_softmax,
// attention_mix); tests/fusion_attention_test.cpp checks the two agree.
// Order: after qkv (PassInfo::after), so that q, k and v are views of one QKV output when it
// looks at their readers; before cast, which would otherwise see the bf16 probabilities' cast
// that this pass absorbs.
// Thread safety: stateless.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "fusion/ops/flash_attention.h"
#include "fusion/pass_util.h"
#include "fusion/passes.h"
#include "fusion/rewrite.h"
#include "model/graph_edit.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/causal_softmax.h"

namespace ft {
namespace {

const char* const kPass = attention_info().name;
constexpr int kMinTile = 8;

// The chain starting at a scores op, or the reason it cannot be fused. Under train.precision:
// bf16 a cast op sits between softmax and mix (autocast casts the probabilities for the mix GEMM).
struct AttentionChain {
  int scores = -1, softmax = -1, cast = -1, mix = -1;  // op indices; cast -1 in fp32
  std::string refusal;                                 // empty when fusable

  std::vector<int> ops() const {
    if (cast < 0) return {scores, softmax, mix};
    return {scores, softmax, cast, mix};
  }
};

// The op reading `id`, when it is the only one and `id` is no graph result; else -1 and `why`.
int sole_consumer(const Graph& graph, const GraphIndex& index, ValueId id, std::string* why) {
  const std::string quoted = "'" + graph.values[id].name + "'";
  return sole_reader(index, id, quoted, quoted, why);
}

AttentionChain match_chain(const Graph& graph, const GraphIndex& index, int scores_index) {
  AttentionChain chain;
  chain.scores = scores_index;
  const Op& scores = *graph.ops[scores_index];
  chain.softmax = sole_consumer(graph, index, scores.outputs[0], &chain.refusal);
  if (chain.softmax < 0) return chain;
  const Op& softmax = *graph.ops[chain.softmax];
  if (softmax.op_kind() != OpKind::kCausalSoftmax) {
    chain.refusal = "scores feed a " + std::string(softmax.kind()) + ", not a causal softmax";
    return chain;
  }
  ValueId probs = softmax.outputs[0];
  chain.mix = sole_consumer(graph, index, probs, &chain.refusal);
  if (chain.mix < 0) return chain;
  if (graph.ops[chain.mix]->op_kind() == OpKind::kCast) {
    chain.cast = chain.mix;
    probs = graph.ops[chain.cast]->outputs[0];
    chain.mix = sole_consumer(graph, index, probs, &chain.refusal);
    if (chain.mix < 0) return chain;
  }
  const Op& mix = *graph.ops[chain.mix];
  if (mix.op_kind() != OpKind::kAttentionMix || mix.inputs[0] != probs) {
    chain.refusal = "probabilities feed a " + std::string(mix.kind()) + ", not an attention mix";
    return chain;
  }
  const auto& s = static_cast<const AttentionScoresOp&>(scores);
  const auto& m = static_cast<const AttentionMixOp&>(mix);
  if (s.batch() != m.batch() || s.seq_len() != m.seq_len() || s.channels() != m.channels() ||
      s.n_head() != m.n_head())
    chain.refusal = "scores and mix ops disagree on the attention shape";
  return chain;
}

// Query and key rows per tile such that one tile x tile block of scores fits tile_kb KiB.
int tile_rows(int tile_kb, int seq_len) {
  const int fitting = static_cast<int>(std::sqrt(static_cast<double>(tile_kb) * 1024.0 / 4.0));
  return std::min(std::max(fitting, kMinTile), std::max(seq_len, 1));
}

// "h.0.attn.scores" -> "h.0.attn.flash_attention".
std::string fused_name(const std::string& scores_name) {
  const size_t dot = scores_name.rfind('.');
  return (dot == std::string::npos ? std::string() : scores_name.substr(0, dot + 1)) +
         "flash_attention";
}

class AttentionPass : public CandidatePass {
 public:
  const PassInfo& info() const override { return attention_info(); }

 protected:
  bool is_candidate(const Op& op) const override {
    return op.op_kind() == OpKind::kAttentionScores;
  }

  std::optional<Fusion> decide(const Graph& graph, const GraphIndex& index, int op_index,
                               PassContext& context) const override {
    const std::string site = graph.ops[op_index]->name;
    const AttentionChain chain = match_chain(graph, index, op_index);
    if (!chain.refusal.empty()) {
      context.skipped(kPass, site, chain.refusal);
      return std::nullopt;
    }
    const int chain_ops =
        counted_ops(static_cast<int>(chain.ops().size()), chain.cast >= 0 ? 1 : 0);
    if (!within_max_ops(context, kPass, site, chain_ops)) return std::nullopt;
    const auto& scores = static_cast<const AttentionScoresOp&>(*graph.ops[chain.scores]);
    const Op& mix = *graph.ops[chain.mix];
    const int tile = tile_rows(context.options.tile_kb, scores.seq_len());
    Fusion fusion;
    fusion.absorbed = chain.ops();  // placed where the mix was: v may be produced after scores
    fusion.op = std::make_unique<FlashAttentionOp>(scores.batch(), scores.seq_len(),
                                                   scores.channels(), scores.n_head(), tile);
    fusion.name = fused_name(site);
    fusion.inputs = {scores.inputs[0], scores.inputs[1], mix.inputs[1]};
    fusion.outputs = {mix.outputs[0]};
    fusion.site = site;
    fusion.what = std::string(chain.cast < 0 ? "scores+causal_softmax+mix"
                                             : "scores+causal_softmax+cast+mix") +
                  " -> flash_attention (tile " + std::to_string(tile) + ")";
    return fusion;
  }
};

}  // namespace

std::unique_ptr<FusionPass> make_attention_pass() {
  return std::make_unique<AttentionPass>();
}

}  // namespace ft
