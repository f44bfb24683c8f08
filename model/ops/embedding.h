// Token + position embedding: x[b, t, :] = wte[tokens[b*T + t], :] + wpe[t, :].
// Inputs {} (token ids come from Workspace::tokens, [B*T]), outputs {x [B, T, C]},
// params {wte [V, C], wpe [T, C]}. wte is shared with the tied LM head, whose gradient adds to it.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

// REQUIRES: every token in [0, vocab) (checked).
void embedding_forward(float* x, const int32_t* tokens, const float* wte, const float* wpe,
                       int batch, int seq_len, int channels, int64_t vocab);
// dwte[token] += dx[b, t]; dwpe[t] += sum over b of dx[b, t].
void embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tokens, int batch,
                        int seq_len, int channels);

class EmbeddingOp : public Op {
 public:
  EmbeddingOp(int batch, int seq_len, int channels);
  OpKind op_kind() const override { return OpKind::kEmbedding; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  int batch_, seq_len_, channels_;
};

}  // namespace ft
