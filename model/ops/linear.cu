// Linear on CUDA: the three GEMMs of linear.cpp through gemm_cuda, and the bias gradient through
// the column-sum kernel of core/cuda/bias_activation_kernel.h. In bf16 (train.precision: bf16)
// the GEMMs multiply bf16 x, the weight's bf16 copy and dy rounded once by CastOp's kernel, as
// linear_backward_bf16 does on the CPU. No kernels of its own.
#include <algorithm>
#include <vector>

#include "core/cuda/bias_activation_kernel.h"
#include "core/gemm.h"
#include "model/ops/cast.h"
#include "model/ops/linear.h"

namespace ft {

void linear_forward_cuda(float* y, GemmOperand x, GemmOperand weight, const float* bias,
                         int64_t rows, int64_t in_features, int64_t out_features, int64_t y_stride,
                         int64_t x_stride, CudaStream stream) {
  // The bias rides in cuBLASLt's BIAS epilogue.
  gemm_cuda(y, x, weight,
            linear_forward_gemm(rows, in_features, out_features, bias, y_stride, x_stride), stream);
}

namespace {

// dx (=|+=) dy_gemm W and dW += dy_gemm^T x, where dy_gemm is dy itself (fp32) or its packed bf16
// copy (row stride dy_gemm_stride); db += the column sums of the fp32 dy.
void linear_backward_gemms(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                           const float* dy, int64_t dy_stride, GemmOperand dy_gemm,
                           int64_t dy_gemm_stride, GemmOperand x, GemmOperand weight, int64_t rows,
                           int64_t in_features, int64_t out_features, int64_t x_stride,
                           CudaStream stream) {
  if (dx != nullptr)
    gemm_cuda(
        dx, dy_gemm, weight,
        linear_dx_gemm(rows, in_features, out_features, dy_gemm_stride, x_stride, overwrite_dx),
        stream);
  gemm_cuda(dweight, dy_gemm, x,
            linear_dweight_gemm(rows, in_features, out_features, dy_gemm_stride, x_stride), stream);
  // y = ... + b broadcast over rows  =>  db += sum over rows of dy
  if (dbias != nullptr)
    column_sums_cuda(dbias, true, nullptr, dy, nullptr, rows, out_features, 0, dy_stride, 0,
                     stream);
}

}  // namespace

void linear_backward_cuda(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                          const float* dy, const float* x, const float* weight, int64_t rows,
                          int64_t in_features, int64_t out_features, int64_t dy_stride,
                          int64_t x_stride, CudaStream stream) {
  if (dy_stride == 0) dy_stride = out_features;
  linear_backward_gemms(dx, overwrite_dx, dweight, dbias, dy, dy_stride, dy, dy_stride, x, weight,
                        rows, in_features, out_features, x_stride, stream);
}

const bf16_bits* bf16_gradient_copy_cuda(const float* dy, int64_t rows, int64_t cols,
                                         int64_t dy_stride, CudaStream stream) {
  // The last buffer is the current one. Outgrown ones stay allocated: a CUDA graph captured
  // while one of them was current (another Trainer's, in bench) still reads and writes it. They
  // only grow, so this holds less than twice the largest copy.
  static thread_local std::vector<Tensor> buffers;
  const int64_t count = rows * cols;
  if (buffers.empty() || buffers.back().numel() < count)
    buffers.push_back(Tensor::empty({std::max<int64_t>(count, 1)}, Device::kCuda, DType::kBF16));
  bf16_bits* copy = buffers.back().bf16_data();
  cast_forward_cuda(copy, dy, rows, cols, cols, dy_stride, stream);
  return copy;
}

void linear_backward_bf16_cuda(float* dx, bool overwrite_dx, float* dweight, float* dbias,
                               const float* dy, const bf16_bits* x, const bf16_bits* weight,
                               int64_t rows, int64_t in_features, int64_t out_features,
                               int64_t dy_stride, int64_t x_stride, CudaStream stream) {
  if (dy_stride == 0) dy_stride = out_features;
  // The packed copy has row stride out_features; dx and dW read it, db sums the fp32 dy.
  const bf16_bits* dy_bf16 = bf16_gradient_copy_cuda(dy, rows, out_features, dy_stride, stream);
  linear_backward_gemms(dx, overwrite_dx, dweight, dbias, dy, dy_stride, dy_bf16, out_features, x,
                        weight, rows, in_features, out_features, x_stride, stream);
}

}  // namespace ft
