// Linear on CUDA: the three GEMMs of linear.cpp through gemm_cuda, and the bias gradient through
// the column-sum kernel of core/cuda/bias_activation_kernel.h. No kernels of its own.
#include "core/cuda/bias_activation_kernel.h"
#include "core/gemm.h"
#include "model/ops/linear.h"

namespace ft {

void linear_forward_cuda(float* y, const float* x, const float* weight, const float* bias,
                         int64_t rows, int64_t in_features, int64_t out_features, int64_t y_stride,
                         int64_t x_stride, CudaStream stream) {
  GemmArgs args;
  args.m = rows;
  args.n = out_features;
  args.k = in_features;
  args.lda = x_stride;
  args.ldc = y_stride;
  args.transpose_b = true;  // W is stored [out, in] = [N, K]
  args.bias = bias;         // cuBLASLt's BIAS epilogue
  gemm_cuda(y, x, weight, args, stream);
}

void linear_backward_cuda(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                          const float* weight, int64_t rows, int64_t in_features,
                          int64_t out_features, int64_t dy_stride, int64_t x_stride,
                          CudaStream stream) {
  if (dy_stride == 0) dy_stride = out_features;
  // y = x W^T  =>  dx += dy W          ([rows, out] · [out, in])
  if (dx != nullptr) {
    GemmArgs args;
    args.m = rows;
    args.n = in_features;
    args.k = out_features;
    args.lda = dy_stride;
    args.ldc = x_stride;
    args.accumulate = true;
    gemm_cuda(dx, dy, weight, args, stream);
  }
  //                dW += dy^T x        ([out, rows] · [rows, in]; dy stored [rows, out] = [K, M])
  GemmArgs args;
  args.m = out_features;
  args.n = in_features;
  args.k = rows;
  args.transpose_a = true;
  args.lda = dy_stride;
  args.ldb = x_stride;
  args.accumulate = true;
  gemm_cuda(dweight, dy, x, args, stream);
  // y = ... + b broadcast over rows  =>  db += sum over rows of dy
  if (dbias != nullptr)
    column_sums_cuda(dbias, true, nullptr, dy, nullptr, rows, out_features, 0, dy_stride, 0,
                     stream);
}

}  // namespace ft
