// BatchNorm's kernels over channels-last (NHWC) activations [rows = B*H*W, C], CPU
// (batchnorm.cpp) beside CUDA (batchnorm.cu), shared by the eager ops (BatchNorm2dOp,
// BatchNormInferenceOp in model/ops/) and the fused ones (BatchNormReluOp, BatchNormAddReluOp in
// fusion/ops/). Over the M = rows values of channel c:
//   mean_c, var_c over (b, h, w), var biased (divide by M);
//   y = gamma_c * (x - mean_c) / sqrt(var_c + eps) + beta_c
//   running_mean = (1 - m) running_mean + m mean_c
//   running_var  = (1 - m) running_var  + m var_c * M / (M - 1)     (unbiased, as PyTorch)
// Only plain BatchNorm is here. Its loops (batchnorm_loops.h, and batchnorm_cuda_loops.cuh on
// CUDA) are generic over the elementwise pass's output and backward's dz, and fusion/'s ReLU
// variants (fusion/ops/batchnorm_relu_kernels.h) instantiate them with a ReLU, so the fused ops
// evaluate the very same expressions as the eager chain and the two agree bit for bit.
// Thread safety: loops are parallel over row chunks with OpenMP, and statistics are summed in a
// fixed chunk order, so results do not depend on the thread count; a BatchNormScratch belongs to
// one caller at a time.
#pragma once
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace ft {

// Buffers the batchnorm_* functions reuse from call to call; each op owns one, so a step
// allocates nothing.
struct BatchNormScratch {
  std::vector<float> chunk_sums;         // [chunks][2][C] float partial sums over row chunks
  std::vector<double> sums;              // [2][C] their totals, summed in chunk order
  std::vector<float> coefficients;       // [3][C] per-channel factors of the elementwise passes
  std::vector<float> mask_coefficients;  // [2][C] forward's {scale, shift} (fusion's ReLU masks)
  // On cuda, on the device (allocated on first use; batchnorm.cu): [2][C] the batch mean and
  // invstd forward saves for backward, [chunks][2][C] float partial sums, and [3][C]
  // coefficients. On cuda the ops' host saved_mean/saved_invstd are unused.
  Tensor device_saved, device_partials, device_coefficients;
};

// Rows the CUDA reductions sum in float per chunk before the chunks are summed in double (as the
// CPU's chunks of 128 rows).
constexpr int64_t kBatchNormCudaRowsPerChunk = 128;

// Batch statistics over the rows (B*H*W) of x [rows, channels]: y = gamma x_hat + beta.
// Writes the batch mean and 1 / sqrt(batch var + eps) to saved_mean and saved_invstd [channels]
// for batchnorm_backward, and moves running_mean and running_var (read and written) toward the
// batch statistics by `momentum`.
// REQUIRES: rows >= 2 (the unbiased variance needs two values).
void batchnorm_forward_train(float* y, float* saved_mean, float* saved_invstd, float* running_mean,
                             float* running_var, const float* x, const float* gamma,
                             const float* beta, int64_t rows, int channels, float momentum,
                             float eps, BatchNormScratch& scratch);

// Backward of batchnorm_forward_train: dgamma += ..., dbeta += ..., and dx += ... (= when
// dx_fresh; see Op::overwrites_fresh_input_grads); the math is derived in batchnorm_loops.h.
void batchnorm_backward(float* dx, float* dgamma, float* dbeta, const float* dy, const float* x,
                        const float* gamma, const float* saved_mean, const float* saved_invstd,
                        int64_t rows, int channels, bool dx_fresh, BatchNormScratch& scratch);

// The per-channel half of batchnorm_forward_train, for fused ops that bring their own
// elementwise pass (fusion/ops/batchnorm_add_relu.h): the reduction pass and running-statistics
// update, leaving {scale, shift} [2][C] in scratch.coefficients, so that z = scale x + shift.
void batchnorm_train_statistics(float* saved_mean, float* saved_invstd, float* running_mean,
                                float* running_var, const float* x, const float* gamma,
                                const float* beta, int64_t rows, int channels, float momentum,
                                float eps, BatchNormScratch& scratch);

// scale = gamma * invstd and shift = beta - mean * scale, so that z = scale x + shift: the
// coefficients batchnorm_train_statistics leaves, recomputed bit for bit from its saved statistics
// (for a backward that recomputes z instead of reading a ReLU's output).
void normalisation_coefficients(float* scale, float* shift, const float* gamma, const float* beta,
                                const float* mean, const float* invstd, int channels);

// Running statistics: y = gamma (x - running_mean) / sqrt(running_var + eps) + beta.
// Forward only; nothing is saved and the statistics are not touched.
void batchnorm_forward_inference(float* y, const float* x, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, int64_t rows,
                                 int channels, float eps, BatchNormScratch& scratch);

// The functions above on device pointers, enqueued on `stream` (batchnorm.cu; CUDA builds
// only). partials holds 2 * channels * ceil(rows / kBatchNormCudaRowsPerChunk) floats and
// coefficients 3 * channels.
void batchnorm_forward_train_cuda(float* y, float* saved_mean, float* saved_invstd,
                                  float* running_mean, float* running_var, float* partials,
                                  float* coefficients, const float* x, const float* gamma,
                                  const float* beta, int64_t rows, int channels, float momentum,
                                  float eps, CudaStream stream);
void batchnorm_backward_cuda(float* dx, float* dgamma, float* dbeta, float* partials,
                             float* coefficients, const float* dy, const float* x,
                             const float* gamma, const float* saved_mean, const float* saved_invstd,
                             int64_t rows, int channels, bool dx_fresh, CudaStream stream);
// The statistics half of forward on cuda: {scale, shift} [2][C] go to `coefficients`.
void batchnorm_train_statistics_cuda(float* saved_mean, float* saved_invstd, float* running_mean,
                                     float* running_var, float* partials, float* coefficients,
                                     const float* x, const float* gamma, const float* beta,
                                     int64_t rows, int channels, float momentum, float eps,
                                     CudaStream stream);
// Backward's per-channel step on cuda, from the chunk partials {sum dz, sum dz (x - mean)} that a
// partial-sums launch of batchnorm_cuda_loops.cuh left in `partials`: dgamma, dbeta += and
// {k_dy, k_x, k_0} [3][C] to `coefficients`, so that dx = k_dy dz + k_x (x - mean) + k_0.
void batchnorm_backward_coefficients_cuda(float* dgamma, float* dbeta, float* coefficients,
                                          const float* partials, const float* gamma,
                                          const float* saved_invstd, int64_t rows, int channels,
                                          CudaStream stream);
void batchnorm_forward_inference_cuda(float* y, const float* x, const float* gamma,
                                      const float* beta, const float* running_mean,
                                      const float* running_var, int64_t rows, int channels,
                                      float eps, CudaStream stream);

// On cuda, the device buffers of `scratch` for `rows` x `channels` (kept while the sizes fit).
void ensure_batchnorm_device_scratch(BatchNormScratch& scratch, int64_t rows, int channels);

// One BatchNorm of an op on one device: where its data and statistics live (host pointers on the
// CPU, device pointers on cuda), as the ops resolve them from their wiring
// (batchnorm_branch in model/ops/batchnorm.h).
struct BatchNormBranch {
  const float* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* running_mean = nullptr;
  float* running_var = nullptr;
  float* saved_mean = nullptr;    // [C], written by forward
  float* saved_invstd = nullptr;  // [C], written by forward
  float* partials = nullptr;      // cuda: the reductions' chunk partials
  float* coefficients = nullptr;  // cuda: [3][C] per-channel factors
  float momentum = 0.1f, eps = 1e-5f;
  // Backward: dx (+)= (= when dx_fresh), dgamma and dbeta +=.
  float* dx = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  bool dx_fresh = false;
};

// The functions above on a branch `b` of `rows` x `channels`: its x, params and statistics, and
// (backward) its gradients; inference reads only x, the params and eps. The cuda forms take the
// branch's device buffers (batchnorm.cu; CUDA builds only).
void batchnorm_forward_train(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                             BatchNormScratch& scratch);
void batchnorm_backward(const float* dy, const BatchNormBranch& b, int64_t rows, int channels,
                        BatchNormScratch& scratch);
void batchnorm_forward_inference(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                                 BatchNormScratch& scratch);
void batchnorm_forward_train_cuda(float* y, const BatchNormBranch& b, int64_t rows, int channels,
                                  CudaStream stream);
void batchnorm_backward_cuda(const float* dy, const BatchNormBranch& b, int64_t rows, int channels,
                             CudaStream stream);
void batchnorm_forward_inference_cuda(float* y, const BatchNormBranch& b, int64_t rows,
                                      int channels, CudaStream stream);

}  // namespace ft
