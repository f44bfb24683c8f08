// Linear on CUDA: the three GEMMs of linear.cpp through gemm_cuda, and the bias gradient through
// the column-sum kernel of core/cuda/bias_activation_kernel.h. No kernels of its own.
#include "core/cuda/bias_activation_kernel.h"
#include "core/gemm.h"
#include "model/ops/linear.h"

namespace ft {

void linear_forward_cuda(float* y, const float* x, const float* weight, const float* bias,
                         int64_t rows, int64_t in_features, int64_t out_features, int64_t y_stride,
                         int64_t x_stride, CudaStream stream) {
  // The bias rides in cuBLASLt's BIAS epilogue.
  gemm_cuda(y, x, weight,
            linear_forward_gemm(rows, in_features, out_features, bias, y_stride, x_stride), stream);
}

void linear_backward_cuda(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                          const float* dy, const float* x, const float* weight, int64_t rows,
                          int64_t in_features, int64_t out_features, int64_t dy_stride,
                          int64_t x_stride, CudaStream stream) {
  if (dy_stride == 0) dy_stride = out_features;
  if (dx != nullptr)
    gemm_cuda(dx, dy, weight,
              linear_dx_gemm(rows, in_features, out_features, dy_stride, x_stride, overwrite_dx),
              stream);
  gemm_cuda(dweight, dy, x,
            linear_dweight_gemm(rows, in_features, out_features, dy_stride, x_stride), stream);
  // y = ... + b broadcast over rows  =>  db += sum over rows of dy
  if (dbias != nullptr)
    column_sums_cuda(dbias, true, nullptr, dy, nullptr, rows, out_features, 0, dy_stride, 0,
                     stream);
}

}  // namespace ft
