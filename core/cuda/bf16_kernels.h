// The few bf16 kernels core/ itself needs under train.precision: bf16 on cuda: filling a bf16
// tensor (Tensor::fill, so a workspace's bf16 values start as zeros as fp32 ones do), widening
// bf16 into fp32 (overwriting or adding: the cuDNN bf16 convolutions' outputs), and the
// bias gradient of a bf16 GEMM operand for the unfused kBiasGradA epilogue of CublasLtGemm (the
// fp32 twins are row_sums_cuda / column_sums_cuda of core/cuda/bias_activation_kernel.h). The
// rounding is core/math/bf16_math.h's, shared with the CPU.
// Thread safety: the launchers only enqueue work on the given stream; safe from any thread.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/math/bf16_math.h"

namespace ft {

// out[i] = float(in[i]) (exact) for i < count, on `stream`: bf16 operands of a kernel that
// computes in fp32 (flash attention under train.precision: bf16).
void cuda_widen_bf16(float* out, const bf16_bits* in, int64_t count, CudaStream stream);
// out[i] += float(in[i]) for i < count, on `stream`: a bf16 result added into an fp32 gradient
// (model/ops/conv2d_bf16.cu).
void cuda_add_widened_bf16(float* out, const bf16_bits* in, int64_t count, CudaStream stream);

// data[i] = value for i < count, on `stream`.
void cuda_fill_bf16(bf16_bits* data, int64_t count, bf16_bits value, CudaStream stream);

// sums[r] = sum_c float(x[r, c]) over x [rows, cols] with row stride ld_x (elements), summed in
// fp32 in a fixed order.
void bf16_row_sums_cuda(float* sums, const bf16_bits* x, int64_t rows, int64_t cols, int64_t ld_x,
                        CudaStream stream);
// sums[c] = sum_r float(x[r, c]) over x [rows, cols] with row stride ld_x (elements), summed in
// fp32 in a fixed order.
void bf16_column_sums_cuda(float* sums, const bf16_bits* x, int64_t rows, int64_t cols,
                           int64_t ld_x, CudaStream stream);

}  // namespace ft
