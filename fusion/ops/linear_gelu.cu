// Linear + GELU on CUDA: forward is one GEMM with the GELU_AUX(_BIAS) epilogue of gemm_cuda;
// backward is the fused dGELU + bias-gradient column kernel of core/cuda/bias_activation_kernel.h
// (which computes with core/math/gelu.h, like linear_gelu.cpp), then the dx and dW GEMMs.
#include "core/cuda/bias_activation_kernel.h"
#include "core/gemm.h"
#include "fusion/ops/linear_gelu.h"
#include "model/ops/linear.h"

namespace ft {

void linear_gelu_forward_cuda(float* y, float* pre, const float* x, const float* weight,
                              const float* bias, int64_t rows, int64_t in_features,
                              int64_t out_features, int64_t y_stride, int64_t x_stride,
                              CudaStream stream) {
  GemmArgs args = linear_forward_gemm(rows, in_features, out_features, bias, y_stride, x_stride);
  args.epilogue = Epilogue::kGeluTanhAux;  // pre = x W^T + b into aux, y = gelu(pre)
  args.aux = pre;
  args.ld_aux = out_features;
  gemm_cuda(y, x, weight, args, stream);
}

void linear_gelu_backward_cuda(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                               float* dpre, const float* dy, const float* pre, const float* x,
                               const float* weight, int64_t rows, int64_t in_features,
                               int64_t out_features, int64_t dy_stride, int64_t x_stride,
                               CudaStream stream) {
  if (dy_stride == 0) dy_stride = out_features;
  // y = gelu(pre)  =>  dpre = dy gelu'(pre);  pre = ... + b  =>  db += colsum(dpre). One pass.
  column_sums_cuda(dbias, true, dpre, dy, pre, rows, out_features, out_features, dy_stride,
                   out_features, stream);
  // pre = x W^T  =>  dx (=|+=) dpre W   ([rows, out] · [out, in])
  // dpre is packed: row stride out_features.
  if (dx != nullptr) {
    GemmArgs args = linear_dx_gemm(rows, in_features, out_features, out_features, x_stride);
    args.accumulate = !overwrite_dx;
    gemm_cuda(dx, dpre, weight, args, stream);
  }
  //                 dW += dpre^T x
  gemm_cuda(dweight, dpre, x,
            linear_dweight_gemm(rows, in_features, out_features, out_features, x_stride), stream);
}

}  // namespace ft
