// Attention mix, the last eager attention op: the probability-weighted sum of values per head,
//   y[b, t, head h] = sum_s probs[b, h, t, s] v[b, s, head h]      (heads concatenated, hd = C/NH).
// Every (t, s) enters the gemm; causal probabilities are zero above the diagonal.
// Backward, per head:  dP += dY V^T,  dV += P^T dY.
// Inputs {probs [B, NH, T, T], v [B, T, C]} (v may be a column view), outputs {y [B, T, C]}
// (may be a view). No state is saved.
// Thread safety: an op instance belongs to one training thread (gemm runs on oneDNN's pool).
#pragma once
#include <cstdint>

#include "core/gemm.h"
#include "model/graph.h"
#include "model/ops/attention_head_gemm_op.h"

namespace ft {

// Writes y. v and y rows are `v_stride` and `y_stride` elements apart. Under train.precision:
// bf16, probs and v are bf16 values (cast ops' outputs); y is fp32 either way.
void attention_mix_forward(float* y, GemmOperand probs, GemmOperand v, int64_t y_stride,
                           int64_t v_stride, int batch, int seq_len, int channels, int n_head);
// dprobs (+=) dY V^T and dv (+=) P^T dY; `overwrite_dprobs` / `overwrite_dv` write (=) instead.
// With bf16 operands dY is rounded to bf16 once and both products read that copy.
void attention_mix_backward(float* dprobs, float* dv, const float* dy, GemmOperand probs,
                            GemmOperand v, int64_t y_stride, int64_t v_stride,
                            bool overwrite_dprobs, bool overwrite_dv, int batch, int seq_len,
                            int channels, int n_head);

// The same on device pointers, enqueued on `stream` (attention_mix.cu; CUDA builds only).
void attention_mix_forward_cuda(float* y, GemmOperand probs, GemmOperand v, int64_t y_stride,
                                int64_t v_stride, int batch, int seq_len, int channels, int n_head,
                                CudaStream stream);
void attention_mix_backward_cuda(float* dprobs, float* dv, const float* dy, GemmOperand probs,
                                 GemmOperand v, int64_t y_stride, int64_t v_stride,
                                 bool overwrite_dprobs, bool overwrite_dv, int batch, int seq_len,
                                 int channels, int n_head, CudaStream stream);

class AttentionMixOp : public AttentionHeadGemmOp {
 public:
  AttentionMixOp(int batch, int seq_len, int channels, int n_head);
  OpKind op_kind() const override { return OpKind::kAttentionMix; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;

 private:
  void check_wiring(const Workspace& ws) const;
};

}  // namespace ft
