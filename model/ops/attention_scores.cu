// Attention scores on CUDA: the GEMMs of attention_scores.cpp through gemm_cuda, as strided
// batches over the heads (or the sequences); no kernels of its own.
#include "core/gemm.h"
#include "kernels/attention_heads.h"
#include "model/ops/attention_scores.h"
#include "model/ops/linear.h"

namespace ft {

void attention_head_gemms_cuda(float* c, GemmOperand a, GemmOperand b, const GemmArgs& per_head,
                               int batch, int64_t seq_offset_a, int64_t seq_offset_b,
                               int64_t seq_offset_c, CudaStream stream) {
  GemmArgs args = resolve_gemm_strides(per_head);
  if (batch <= args.batch) {
    for (int s = 0; s < batch; ++s)
      gemm_cuda(c + s * seq_offset_c, a.at(s * seq_offset_a), b.at(s * seq_offset_b), args, stream);
    return;
  }
  // Swap the roles: loop over the heads, the sequences become the strided batch.
  const int64_t n_head = args.batch;
  const int64_t head_a = args.batch_stride_a, head_b = args.batch_stride_b,
                head_c = args.batch_stride_c;
  args.batch = batch;
  args.batch_stride_a = seq_offset_a;
  args.batch_stride_b = seq_offset_b;
  args.batch_stride_c = seq_offset_c;
  for (int64_t h = 0; h < n_head; ++h)
    gemm_cuda(c + h * head_c, a.at(h * head_a), b.at(h * head_b), args, stream);
}

void attention_scores_forward_cuda(float* scores, GemmOperand q, GemmOperand k, int64_t q_stride,
                                   int64_t k_stride, int batch, int seq_len, int channels,
                                   int n_head, CudaStream stream) {
  const int64_t T = seq_len, hd = channels / n_head;
  // S[h] = scale Q[h] K[h]^T: [T, hd] x [hd, T]; K[h] is stored [T, hd] = [N, K].
  const GemmArgs args = attention_scores_gemm(T, hd, n_head, q_stride, k_stride);
  attention_head_gemms_cuda(scores, q, k, args, batch, T * q_stride, T * k_stride, n_head * T * T,
                            stream);
}

void attention_scores_backward_cuda(float* dq, float* dk, const float* dscores, GemmOperand q,
                                    GemmOperand k, int64_t q_stride, int64_t k_stride,
                                    bool overwrite_dq, bool overwrite_dk, int batch, int seq_len,
                                    int channels, int n_head, CudaStream stream) {
  const int64_t T = seq_len, hd = channels / n_head;
  // Both products read the one rounded copy before the next call may reuse it (one stream).
  const GemmOperand dS =
      q.dtype == DType::kBF16
          ? GemmOperand(bf16_gradient_copy_cuda(dscores, int64_t{batch} * n_head * T, T, T, stream))
          : GemmOperand(dscores);
  const AttentionScoresGradGemms gemms =
      attention_scores_grad_gemms(T, hd, n_head, q_stride, k_stride, overwrite_dq, overwrite_dk);
  const GemmArgs &dqueries = gemms.dqueries, &dkeys = gemms.dkeys;
  // dq completes before dk starts (one stream), so dk adds to it when q and k are one value.
  attention_head_gemms_cuda(dq, dS, k, dqueries, batch, n_head * T * T, T * k_stride, T * q_stride,
                            stream);
  attention_head_gemms_cuda(dk, dS, q, dkeys, batch, n_head * T * T, T * q_stride, T * k_stride,
                            stream);
}

}  // namespace ft
