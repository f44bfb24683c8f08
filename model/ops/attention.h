// Causal multi-head self-attention over a fused qkv activation.
//   qkv [B, T, 3C]: per token q = [0, C), k = [C, 2C), v = [2C, 3C); head h owns columns
//   [h*hd, (h+1)*hd) inside each, hd = C / NH.
//   y[b, t, h*hd:(h+1)*hd] = sum_{s <= t} softmax_s(q_t · k_s / sqrt(hd)) v_s      (heads
//   concatenated)
// Inputs {qkv}, outputs {y [B, T, C]}. Forward saves the probabilities [B, NH, T, T] (zero above
// the diagonal). Every matmul is one head-batched oneDNN gemm per sequence, addressing the heads
// in place through leading dimension 3C and batch stride hd.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "model/graph.h"

namespace ft {

// Writes y [B, T, C] and probs [B, NH, T, T].
void attention_forward(float* y, float* probs, const float* qkv, int batch, int seq_len,
                       int channels, int n_head);
// dqkv += ...; `scratch` holds [NH, T, T] floats.
void attention_backward(float* dqkv, float* scratch, const float* dy, const float* qkv,
                        const float* probs, int batch, int seq_len, int channels, int n_head);

class CausalSelfAttentionOp : public Op {
 public:
  CausalSelfAttentionOp(int batch, int seq_len, int channels, int n_head);
  OpKind op_kind() const override { return OpKind::kFlashAttention; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;

  // Attention probabilities of the last forward, [B, NH, T, T].
  const Tensor& probs() const { return probs_; }

 private:
  void check_wiring(const Workspace& ws) const;
  int batch_, seq_len_, channels_, n_head_;
  Tensor probs_;    // saved by forward
  Tensor scratch_;  // backward's dP / dS for one sequence, [NH, T, T]
};

}  // namespace ft
