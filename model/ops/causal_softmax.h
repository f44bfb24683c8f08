// Causal softmax over attention scores, the middle eager attention op:
//   probs[b, h, t, s] = exp(scores[t, s] - m_t) / sum_{s' <= t} exp(scores[t, s'] - m_t)  for s <=
//   t, probs[b, h, t, s] = 0                                                                  for s
//   > t,
// with m_t the row maximum over s <= t. Scores above the diagonal are never read.
// Backward: dS[t, s] = P[t, s] (dP[t, s] - sum_{s' <= t} P[t, s'] dP[t, s']) for s <= t, else 0.
// Inputs {scores [B, NH, T, T]}, outputs {probs [B, NH, T, T]}. No state is saved: backward reads
// the probabilities from the output value.
// Thread safety: an op instance belongs to one training thread (rows run on OpenMP).
#pragma once
#include <cstdint>

#include "model/graph.h"

namespace ft {

// Writes probs; `rows` = B * NH * T rows of T.
void causal_softmax_forward(float* probs, const float* scores, int64_t rows, int seq_len);
// dscores (+=) dS, or (=) with `overwrite` (then every element, the zero upper triangle included).
void causal_softmax_backward(float* dscores, const float* dprobs, const float* probs,
                             bool overwrite, int64_t rows, int seq_len);

// The same on device pointers, enqueued on `stream` (causal_softmax.cu; CUDA builds only): one
// warp per row.
void causal_softmax_forward_cuda(float* probs, const float* scores, int64_t rows, int seq_len,
                                 CudaStream stream);
void causal_softmax_backward_cuda(float* dscores, const float* dprobs, const float* probs,
                                  bool overwrite, int64_t rows, int seq_len, CudaStream stream);

class CausalSoftmaxOp : public Op {
 public:
  CausalSoftmaxOp(int batch, int n_head, int seq_len);
  OpKind op_kind() const override { return OpKind::kCausalSoftmax; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int batch() const { return batch_; }
  int n_head() const { return n_head_; }
  int seq_len() const { return seq_len_; }

 private:
  void check_wiring(const Workspace& ws) const;
  int batch_, n_head_, seq_len_;
};

}  // namespace ft
