// AttentionHeadGemmOp: what the two eager attention GEMM ops (AttentionScoresOp, AttentionMixOp)
// share: B sequences of T tokens whose C channels split into n_head heads of C / n_head, the
// shape checks, and the cost of one head-batched GEMM forward and two backward.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

class AttentionHeadGemmOp : public Op {
 public:
  bool overwrites_fresh_input_grads() const override { return true; }
  bool supports_views() const override { return true; }
  bool handles_bf16() const override { return true; }
  // Forward 2 * MACs of the per-head GEMM; backward twice that (one GEMM per input gradient).
  OpCost cost(const Graph& graph) const override;

  int batch() const { return batch_; }
  int seq_len() const { return seq_len_; }
  int channels() const { return channels_; }
  int n_head() const { return n_head_; }

 protected:
  // Throws ft::Error naming `who` for a non-positive size or channels not divisible by n_head.
  AttentionHeadGemmOp(const char* who, int batch, int seq_len, int channels, int n_head);
  int64_t tokens() const { return static_cast<int64_t>(batch_) * seq_len_; }
  int64_t scores_numel() const { return tokens() * n_head_ * seq_len_; }  // [B, NH, T, T]

  int batch_, seq_len_, channels_, n_head_;
};

}  // namespace ft
