// BatchNorm's ReLU variants over NHWC [rows, C], CPU (batchnorm_relu_kernels.cpp) beside CUDA
// (batchnorm_relu_kernels.cu), for the fused ops BatchNormReluOp and BatchNormAddReluOp:
//   forward:  y = max(z, 0) with z = gamma x_hat + beta, applied in BatchNorm's elementwise pass
//             so that z never reaches memory;
//   backward: BatchNorm's backward with dz = dy [z > 0] in place of dy, the mask applied as each
//             element is read (BatchNormMask says where it comes from).
// They run plain BatchNorm's loops (kernels/batchnorm_loops.h, kernels/batchnorm_cuda_loops.cuh)
// with a ReLU policy, so each element sees the expressions of BatchNorm followed by ReluOp
// (batchnorm_relu_math.h) and a fused op agrees with its unfused chain bit for bit. Plain
// BatchNorm, and the statistics these share with it, are in kernels/batchnorm.h.
// Thread safety: as kernels/batchnorm.h: OpenMP loops with a fixed summation order; a
// BatchNormScratch belongs to one caller at a time.
#pragma once
#include <cstdint>

#include "core/device.h"
#include "core/tensor.h"
#include "kernels/batchnorm.h"

namespace ft {

// Where backward's ReLU mask comes from: the saved output y > 0 of a ReLU applied after the
// normalisation (BatchNormAddReluOp, whose y is relu(z + s)); or the normalisation's own
// z = gamma x_hat + beta > 0, recomputed from x with forward's expression (BatchNormReluOp: the
// same mask as y > 0, bit for bit, without reading y).
enum class BatchNormMask { kReluOutput, kRecomputed };

// batchnorm_forward_train (kernels/batchnorm.h) with y = max(z, 0) (0 for NaN, as ReluOp), on a
// branch `b` of `rows` x `channels`. The bf16 form (train.precision: bf16, where y only feeds a
// convolution's cast) rounds each element once from the value the fp32 form stores
// (fusion.vertical.cast).
void batchnorm_relu_forward_train(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                                  BatchNormScratch& scratch);
void batchnorm_relu_forward_train(bf16_bits* y, const BatchNormBranch& b, int64_t rows,
                                  int channels, BatchNormScratch& scratch);

// batchnorm_backward on branch `b` with dy masked as `mask` says. relu_output is read only for
// kReluOutput (and may be null for kRecomputed, which reads b.beta).
void batchnorm_relu_backward(const float* dy, BatchNormMask mask, const float* relu_output,
                             const BatchNormBranch& b, int64_t rows, int channels,
                             BatchNormScratch& scratch);

// batchnorm_relu_backward's reduction pass alone, for fused ops that bring their own elementwise
// pass (batchnorm_add_relu.h): adds to dgamma and dbeta, and leaves {k_dy, k_x, k_0} [3][C] in
// scratch.coefficients, so that dx = k_dy dz + k_x (x - mean) + k_0. relu_output is read only
// for kReluOutput, beta only for kRecomputed; either may be null otherwise.
void batchnorm_relu_backward_statistics(float* dgamma, float* dbeta, const float* dy,
                                        BatchNormMask mask, const float* relu_output,
                                        const float* x, const float* gamma, const float* beta,
                                        const float* saved_mean, const float* saved_invstd,
                                        int64_t rows, int channels, BatchNormScratch& scratch);

// batchnorm_forward_inference with y = max(z, 0), on branch `b`.
void batchnorm_relu_forward_inference(float* y, const BatchNormBranch& b, int64_t rows,
                                      int channels, BatchNormScratch& scratch);

// The same on cuda, on the branch's device buffers, enqueued on `stream` (CUDA builds only).
// Backward reads the mask from the ReLU's output y (kReluOutput). The bf16 forms write y in bf16
// (rounded once, as the CPU's) and read the mask from it.
void batchnorm_relu_forward_train_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                       int channels, CudaStream stream);
void batchnorm_relu_forward_train_cuda(bf16_bits* y, const BatchNormBranch& b, int64_t rows,
                                       int channels, CudaStream stream);
void batchnorm_relu_backward_cuda(const float* dy, const float* relu_output,
                                  const BatchNormBranch& b, int64_t rows, int channels,
                                  CudaStream stream);
void batchnorm_relu_backward_cuda(const float* dy, const bf16_bits* relu_output,
                                  const BatchNormBranch& b, int64_t rows, int channels,
                                  CudaStream stream);
// batchnorm_relu_backward_statistics on cuda, from relu_output: {k_dy, k_x, k_0} [3][C] go to
// `coefficients`; partials as batchnorm_backward_cuda's.
void batchnorm_relu_backward_statistics_cuda(float* dgamma, float* dbeta, float* partials,
                                             float* coefficients, const float* dy,
                                             const float* relu_output, const float* x,
                                             const float* gamma, const float* saved_mean,
                                             const float* saved_invstd, int64_t rows, int channels,
                                             CudaStream stream);
void batchnorm_relu_forward_inference_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                           int channels, CudaStream stream);

}  // namespace ft
