// FusionPass: one graph rewrite of fusion/, switched by one config key. Deciding is apart from
// doing (XLA's ShouldFuse/Fuse): a pass records a Decision for every candidate it looks at,
// fused or skipped with the reason, which is what `fusiontrain plan` prints. Each pass declares
// itself in a PassInfo (its key, family, switch, the op kinds it creates and the passes it must
// run after), kept with the others' in fusion/pass_infos.cpp; fusion/standard_passes.def lists the
// standard ones once, in run order, and bench, tune, fusion advice and the config schema derive
// their pass keys from that list (PassRegistry::standard()). This header and fusion/pass.cpp need
// nothing of the engine. Thread safety: passes are stateless; run on the thread that builds the
// graph.
#pragma once
#include <string>
#include <vector>

#include "model/graph.h"

namespace ft {

// Mirrors the fusion.* config keys (app/config/config.h), so fusion/ does not depend on app/.
struct FusionOptions {
  bool enabled = true;  // false: no compute fusion at all; the executed graph is the built one
  bool fold_bn = true;  // inference.fold_bn: eval graphs fold BatchNorm into the convolution
  struct Vertical {
    bool gemm_epilogue = true;       // Linear -> GELU
    bool residual_layernorm = true;  // (dropout ->) residual add -> LayerNorm
    bool classifier = true;          // LM head -> softmax cross-entropy
    bool attention = true;           // scores -> causal softmax -> weighted sum
    bool bn_relu = true;             // BatchNorm -> ReLU; [BatchNorm(s) ->] add -> ReLU
    bool cast = true;  // bf16: a GEMM operand's producer writes bf16, absorbing its cast op
  } vertical;
  struct Horizontal {
    bool qkv = true;                     // q, k, v Linears -> one GEMM
    bool batched_layernorm = true;       // per-head q/k LayerNorms -> one op
    bool multi_tensor = true;            // optimizer, zeroing, grad norm: one chunked pass
    bool conv_shortcut = true;           // stride-2 3x3 conv + 1x1 shortcut -> one conv
    double max_padding_overhead = 0.25;  // conv_shortcut: extra FLOPs / useful FLOPs allowed
  } horizontal;
  // The whole training step as one captured CUDA graph, replayed each step (train.device cuda;
  // app/training/trainer_graph.cpp): the limit of horizontal launch fusion. Not a graph pass.
  bool cuda_graph = false;
  int max_ops = 4;  // eager ops one fused op may absorb; 1 fuses nothing
  // Live intermediates per row tile of a fused row-tiled op. 1024 (a Zen 4 core's L2): bf16's
  // Linear+GELU tiles need the rows (docs/mixed_precision.md, "Row tiles"); fp32 is the same.
  int tile_kb = 1024;
};

// Where a pass's key lives: fusion.vertical.<name>, fusion.horizontal.<name> or inference.<name>.
enum class PassFamily { kVertical, kHorizontal, kInference };
const char* pass_family_name(PassFamily family);  // "vertical", "horizontal", "inference"

// An eager producer -> consumer edge a vertical pass removes (fusion advice names the pass).
struct FusedEdge {
  OpKind producer, consumer;
};
// A family of independent ops of one kind a horizontal pass merges.
struct MergedFamily {
  OpKind kind;
  bool shared_input = false;  // the members must read the same input
  size_t size = 0;            // the family must have exactly this many members; 0 = any
};

// What a pass, or a switch with no graph rewrite (fusion.horizontal.multi_tensor), declares about
// itself. Everything that lists pass keys reads them from here.
struct PassInfo {
  const char* name;                // the key's last part and the pass's name in plan: "cast"
  PassFamily family;               // with `name`, the config key
  bool* (*flag)(FusionOptions&);   // the key's bool in FusionOptions
  const char* doc;                 // the key's line in the config reference
  std::vector<OpKind> creates;     // the fused op kinds the pass may emit; checked after it runs
  std::vector<std::string> after;  // passes that must run before it when both are in a pipeline
  std::vector<FusedEdge> edges;    // fusion advice: vertical edges this pass fuses
  std::vector<MergedFamily> families;  // fusion advice: horizontal families this pass merges

  std::string key() const;  // "fusion.vertical.cast", "inference.fold_bn"
  bool on(const FusionOptions& options) const {
    return *flag(const_cast<FusionOptions&>(options));  // read only
  }
};

// One candidate a pass looked at.
struct FusionDecision {
  std::string pass;  // "gemm_epilogue"
  std::string site;  // op name where the candidate starts: "h.1.mlp.c_fc"
  bool fused = false;
  std::string reason;  // why not (or what was fused: "linear+gelu")
  int ops_absorbed = 0;
};

struct PassContext {
  const FusionOptions& options;
  const ParamStore& params;
  std::vector<FusionDecision>& decisions;  // the pass appends one per candidate

  void fused(const std::string& pass, const std::string& site, const std::string& what, int ops) {
    decisions.push_back({pass, site, true, what, ops});
  }
  void skipped(const std::string& pass, const std::string& site, const std::string& why) {
    decisions.push_back({pass, site, false, why, 0});
  }
};

class FusionPass {
 public:
  virtual ~FusionPass() = default;
  // REQUIRES: the same object on every call (a function-local static), living for the program;
  // for a standard pass, its entry of fusion/pass_infos.h.
  virtual const PassInfo& info() const = 0;
  // Rewrites `graph` in place; returns how many fused ops it created. Parameter storage is never
  // changed by a pass, so checkpoints move freely between fused and unfused runs.
  virtual int apply(Graph& graph, PassContext& context) const = 0;

  const char* name() const { return info().name; }
  bool enabled(const FusionOptions& options) const { return info().on(options); }
};

}  // namespace ft
