// Attention mix on CUDA: the GEMMs of attention_mix.cpp through gemm_cuda, as strided batches
// (attention_head_gemms_cuda of attention_scores.h); no kernels of its own.
#include "core/gemm.h"
#include "kernels/attention_heads.h"
#include "model/ops/attention_mix.h"
#include "model/ops/attention_scores.h"
#include "model/ops/linear.h"

namespace ft {

void attention_mix_forward_cuda(float* y, GemmOperand probs, GemmOperand v, int64_t y_stride,
                                int64_t v_stride, int batch, int seq_len, int channels, int n_head,
                                CudaStream stream) {
  const int64_t T = seq_len, hd = channels / n_head;
  // Y[h] = P[h] V[h]: [T, T] x [T, hd], written into head h's columns of y.
  const GemmArgs args = square_by_head_gemm(T, hd, n_head, v_stride, y_stride);
  attention_head_gemms_cuda(y, probs, v, args, batch, n_head * T * T, T * v_stride, T * y_stride,
                            stream);
}

void attention_mix_backward_cuda(float* dprobs, float* dv, const float* dy, GemmOperand probs,
                                 GemmOperand v, int64_t y_stride, int64_t v_stride,
                                 bool overwrite_dprobs, bool overwrite_dv, int batch, int seq_len,
                                 int channels, int n_head, CudaStream stream) {
  const int64_t T = seq_len, hd = channels / n_head;
  if (y_stride == 0) y_stride = channels;
  // As on the CPU: in bf16 both products read one packed rounded copy of dY (rows C apart).
  const bool bf16 = v.dtype == DType::kBF16;
  const int64_t dy_stride = bf16 ? channels : y_stride;
  const GemmOperand dY =
      bf16
          ? GemmOperand(bf16_gradient_copy_cuda(dy, int64_t{batch} * T, channels, y_stride, stream))
          : GemmOperand(dy);
  const AttentionMixGradGemms gemms =
      attention_mix_grad_gemms(T, hd, n_head, dy_stride, v_stride, overwrite_dprobs, overwrite_dv);
  const GemmArgs &dp_args = gemms.dprobs, &dv_args = gemms.dvalues;
  attention_head_gemms_cuda(dprobs, dY, v, dp_args, batch, T * dy_stride, T * v_stride,
                            n_head * T * T, stream);
  attention_head_gemms_cuda(dv, probs, dY, dv_args, batch, n_head * T * T, T * dy_stride,
                            T * v_stride, stream);
}

}  // namespace ft
