// Attention scores, the first of the three eager attention ops (scores -> causal softmax -> mix):
//   scores[b, h, t, s] = q[b, t, head h] · k[b, s, head h] / sqrt(hd),   hd = C / NH,
// where head h owns columns [h*hd, (h+1)*hd) of q and k. Every (t, s) is computed, the upper
// triangle included: the causal mask belongs to CausalSoftmaxOp.
// Backward, with scale = 1 / sqrt(hd) and per head:  dq += scale dS K,  dk += scale dS^T Q.
// Inputs {q [B, T, C], k [B, T, C]} (either may be a column view, e.g. of one [B*T, 3C] QKV
// buffer), outputs {scores [B, NH, T, T]}. No state is saved: backward reads q and k.
// Thread safety: an op instance belongs to one training thread (gemm runs on oneDNN's pool).
#pragma once
#include <cstdint>

#include "core/gemm.h"
#include "model/graph.h"
#include "model/ops/attention_head_gemm_op.h"

namespace ft {

// Writes scores [B, NH, T, T]. q and k rows are `q_stride` and `k_stride` elements apart.
// Under train.precision: bf16 q and k are bf16 values (each a cast op's output, as autocast
// casts a matmul's operands); scores are fp32 either way.
void attention_scores_forward(float* scores, GemmOperand q, GemmOperand k, int64_t q_stride,
                              int64_t k_stride, int batch, int seq_len, int channels, int n_head);
// dq (+=) scale dS K and dk (+=) scale dS^T Q; `overwrite_dq` / `overwrite_dk` write (=)
// instead. The gradients share the row strides of their values. With bf16 q and k, dscores is
// rounded to bf16 once (model/ops/linear.h's bf16_gradient_copy) and both products read that.
void attention_scores_backward(float* dq, float* dk, const float* dscores, GemmOperand q,
                               GemmOperand k, int64_t q_stride, int64_t k_stride, bool overwrite_dq,
                               bool overwrite_dk, int batch, int seq_len, int channels, int n_head);

// The same on device pointers, enqueued on `stream` (attention_scores.cu; CUDA builds only).
void attention_scores_forward_cuda(float* scores, GemmOperand q, GemmOperand k, int64_t q_stride,
                                   int64_t k_stride, int batch, int seq_len, int channels,
                                   int n_head, CudaStream stream);
// With bf16 q and k, dscores is rounded once into a device copy (bf16_gradient_copy_cuda).
void attention_scores_backward_cuda(float* dq, float* dk, const float* dscores, GemmOperand q,
                                    GemmOperand k, int64_t q_stride, int64_t k_stride,
                                    bool overwrite_dq, bool overwrite_dk, int batch, int seq_len,
                                    int channels, int n_head, CudaStream stream);
// The attention GEMMs on CUDA: `per_head` has the heads of one sequence as its batch (built by
// kernels/attention_heads.h); sequence b's operands start seq_offset_{a,b,c} * b elements
// further. Runs `batch` strided-batch GEMMs over the heads, or, with more sequences than heads,
// n_head strided-batch GEMMs over the sequences (fewer launches, the same products).
void attention_head_gemms_cuda(float* c, GemmOperand a, GemmOperand b, const GemmArgs& per_head,
                               int batch, int64_t seq_offset_a, int64_t seq_offset_b,
                               int64_t seq_offset_c, CudaStream stream);

class AttentionScoresOp : public AttentionHeadGemmOp {
 public:
  AttentionScoresOp(int batch, int seq_len, int channels, int n_head);
  OpKind op_kind() const override { return OpKind::kAttentionScores; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;

 private:
  void check_wiring(const Workspace& ws) const;
};

}  // namespace ft
