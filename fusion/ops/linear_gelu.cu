// Linear + GELU on CUDA: forward is one GEMM with the GELU_AUX(_BIAS) epilogue of gemm_cuda (or,
// writing bf16, the GEMM then GeluCastOp's kernel); backward is the fused dGELU + bias-gradient
// column kernel of core/cuda/bias_activation_kernel.h (which computes with core/math/gelu_math.h,
// like linear_gelu.cpp), then the dx and dW GEMMs.
#include "core/check.h"
#include "core/cuda/bias_activation_kernel.h"
#include "core/gemm.h"
#include "fusion/ops/layernorm_cast.h"
#include "fusion/ops/linear_gelu.h"
#include "model/ops/cast.h"
#include "model/ops/linear.h"

namespace ft {

void linear_gelu_forward_cuda(float* y, float* pre, GemmOperand x, GemmOperand weight,
                              const float* bias, int64_t rows, int64_t in_features,
                              int64_t out_features, int64_t y_stride, int64_t x_stride,
                              CudaStream stream) {
  GemmArgs args = linear_forward_gemm(rows, in_features, out_features, bias, y_stride, x_stride);
  args.epilogue = Epilogue::kGeluTanhAux;  // pre = x W^T + b into aux, y = gelu(pre)
  args.aux = pre;
  args.ld_aux = out_features;
  gemm_cuda(y, x, weight, args, stream);
}

// cuBLASLt's GELU epilogue writes the type of D, fp32 here: the bf16 y is rounded from the
// fp32 gelu(pre) by a kernel of ours, so it is the CPU tile's bf16(gelu_tanh(pre)).
void linear_gelu_forward_cuda(bf16_bits* y, float* pre, GemmOperand x, GemmOperand weight,
                              const float* bias, int64_t rows, int64_t in_features,
                              int64_t out_features, int64_t y_stride, int64_t x_stride,
                              CudaStream stream) {
  // pre = x W^T + b, packed [rows, out]
  gemm_cuda(pre, x, weight,
            linear_forward_gemm(rows, in_features, out_features, bias, out_features, x_stride),
            stream);
  gelu_cast_forward_cuda(y, pre, rows, out_features, y_stride, out_features, stream);
}

void linear_gelu_backward_cuda(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                               float* dpre, bf16_bits* dpre_bf16, const float* dy, const float* pre,
                               GemmOperand x, GemmOperand weight, int64_t rows, int64_t in_features,
                               int64_t out_features, int64_t dy_stride, int64_t x_stride,
                               CudaStream stream) {
  FT_CHECK((x.dtype == DType::kBF16) == (dpre_bf16 != nullptr),
           "linear_gelu_backward_cuda: bf16 GEMMs need the dpre_bf16 buffer, fp32 ones take none");
  if (dy_stride == 0) dy_stride = out_features;
  // y = gelu(pre)  =>  dpre = dy gelu'(pre);  pre = ... + b  =>  db += colsum(dpre). One pass.
  column_sums_cuda(dbias, true, dpre, dy, pre, rows, out_features, out_features, dy_stride,
                   out_features, stream);
  // The bf16 GEMMs multiply dpre rounded to bf16 once, as the CPU tiles do (db sums fp32 dpre).
  GemmOperand dpre_operand = dpre;
  if (dpre_bf16 != nullptr) {
    cast_forward_cuda(dpre_bf16, dpre, rows, out_features, out_features, out_features, stream);
    dpre_operand = dpre_bf16;
  }
  // pre = x W^T  =>  dx (=|+=) dpre W   ([rows, out] · [out, in])
  // dpre is packed: row stride out_features.
  if (dx != nullptr) {
    GemmArgs args = linear_dx_gemm(rows, in_features, out_features, out_features, x_stride);
    args.accumulate = !overwrite_dx;
    gemm_cuda(dx, dpre_operand, weight, args, stream);
  }
  //                 dW += dpre^T x
  gemm_cuda(dweight, dpre_operand, x,
            linear_dweight_gemm(rows, in_features, out_features, out_features, x_stride), stream);
}

}  // namespace ft
