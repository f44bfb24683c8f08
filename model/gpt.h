// GPT-2 (pre-LayerNorm) as a Graph of ops with handwritten backward passes.
// Parameters are registered once in a ParamStore (register_gpt_params) under their canonical
// names; any number of graphs for different batch sizes (train, eval, inference) are then built
// over the same parameters (build_gpt_graph). The graph reads token ids from Workspace::tokens
// and targets from Workspace::targets; graph.output is the logits [B*T, V], graph.loss the mean
// cross-entropy.
// Thread safety: building is single-threaded; the graph belongs to one training thread.
#pragma once
#include <vector>

#include "model/graph.h"
#include "model/params.h"

namespace ft {

// Mirrors the model.* config keys.
struct GptShape {
  int n_layer = 0;
  int n_head = 0;
  int d_model = 0;
  int seq_len = 0;
  int vocab_size = 0;
  float dropout = 0.0f;  // residual and embedding dropout; 0 builds no dropout ops at all
  bool qk_norm = false;  // LayerNorm over head_dim on q and k before attention
};

// Throws ft::Error naming the model.* key and its allowed values when a field is out of range.
void validate_gpt_shape(const GptShape& shape);

struct GptBlockParamIds {
  ParamId ln_1_weight = -1, ln_1_bias = -1;
  ParamId c_attn_weight = -1, c_attn_bias = -1;
  ParamId q_norm_weight = -1, q_norm_bias = -1;  // -1 unless qk_norm
  ParamId k_norm_weight = -1, k_norm_bias = -1;
  ParamId attn_proj_weight = -1, attn_proj_bias = -1;
  ParamId ln_2_weight = -1, ln_2_bias = -1;
  ParamId fc_weight = -1, fc_bias = -1;
  ParamId mlp_proj_weight = -1, mlp_proj_bias = -1;
};

struct GptParamIds {
  ParamId wte = -1, wpe = -1;
  std::vector<GptBlockParamIds> blocks;
  ParamId ln_f_weight = -1, ln_f_bias = -1;
};

// Registers every parameter, in this order: wte.weight [V,C], wpe.weight [T,C]; per block i:
// h.{i}.ln_1.weight/bias [C], h.{i}.attn.c_attn.weight [3C,C] / bias [3C],
// (qk_norm: h.{i}.attn.q_norm.weight/bias, h.{i}.attn.k_norm.weight/bias [C/NH]),
// h.{i}.attn.c_proj.weight [C,C] / bias [C], h.{i}.ln_2.weight/bias [C],
// h.{i}.mlp.c_fc.weight [4C,C] / bias [4C], h.{i}.mlp.c_proj.weight [C,4C] / bias [C];
// then ln_f.weight/bias [C].
// Init: matrices N(0, 0.02), except attn.c_proj and mlp.c_proj N(0, 0.02 / sqrt(2 n_layer))
// (GPT-2's scaling for the residual-stream writers); biases 0; norm weights 1.
// Weight decay on tensors with >= 2 dims only.
// REQUIRES: params not yet allocated; names not yet taken.
GptParamIds register_gpt_params(const GptShape& shape, ParamStore& params);

// The pre-LN forward graph for `batch` sequences of shape.seq_len tokens, at eager granularity
// (one op per kernel PyTorch eager mode launches):
//   x = dropout(embedding(tokens))
//   per block: q, k, v = three Linears over row blocks of c_attn, of ln_1(x)
//              (qk_norm: one LayerNorm per head of q and one per head of k)
//              a = softmax_causal(q k^T / sqrt(hd)) v     (three ops: scores, softmax, mix)
//              x = x + dropout(c_proj(a))
//              x = x + dropout(mlp.c_proj(gelu(c_fc(ln_2(x)))))
//   logits = ln_f(x) wte^T; loss = cross_entropy(logits, targets)
// Each dropout op gets a distinct salt, so their masks are independent within a step.
// An eval graph has no dropout ops.
// gemm_dtype bf16 (train.precision: bf16) reads every Linear's and the LM head's x through a cast
// op to a bf16 value (one per value), as CPU autocast does; those ops then multiply the bf16
// weight copies (ParamStore::enable_bf16_copies). Attention reads q, k, v and the probabilities
// through casts too, as its GEMMs do.
Graph build_gpt_graph(const GptShape& shape, int batch, const GptParamIds& ids,
                      GraphMode mode = GraphMode::kTrain, DType gemm_dtype = DType::kF32);

// register_gpt_params + build_gpt_graph, for callers that need a single graph.
Graph build_gpt(const GptShape& shape, int batch, ParamStore& params,
                GraphMode mode = GraphMode::kTrain, DType gemm_dtype = DType::kF32);

}  // namespace ft
