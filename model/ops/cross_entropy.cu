// Softmax cross-entropy on CUDA (see cross_entropy.h): one block per row, block-wide max and sum
// through warp shuffles and a 32-float shared array, the loss as logsumexp - logit[target] in
// double as on the CPU; then one block averages the per-row losses in a fixed order, so the
// loss does not depend on scheduling.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/cuda/reduce.cuh"
#include "model/ops/cross_entropy.h"

namespace ft {
namespace {

constexpr int kRowThreads = 256;
constexpr int kMeanThreads = 512;

// Subtracting the row max before exp keeps every term <= 1; the loss logsumexp - z[target]
// stays finite when the target's probability underflows.
__global__ void cross_entropy_forward_kernel(float* probs, float* row_losses, const float* logits,
                                             const int32_t* targets, int64_t classes) {
  __shared__ float partials[32];
  const int64_t row = blockIdx.x;
  const float* logit_row = logits + row * classes;
  float* prob_row = probs + row * classes;
  float max_logit = -INFINITY;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x)
    max_logit = fmaxf(max_logit, logit_row[c]);
  max_logit = block_max(max_logit, partials);
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const float weight = expf(logit_row[c] - max_logit);
    prob_row[c] = weight;
    sum += weight;
  }
  sum = block_sum(sum, partials);
  const float inv_sum = 1.0f / sum;
  for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) prob_row[c] *= inv_sum;
  if (threadIdx.x == 0)
    row_losses[row] =
        static_cast<float>(log(static_cast<double>(sum)) + max_logit - logit_row[targets[row]]);
}

// One block: each thread sums a strided share in double, then a shared-memory tree; both orders
// are fixed, so the same row losses always give the same mean.
__global__ void mean_row_losses_kernel(float* loss, const float* row_losses, int64_t rows) {
  __shared__ double partial[kMeanThreads];
  double sum = 0.0;
  for (int64_t row = threadIdx.x; row < rows; row += kMeanThreads) sum += row_losses[row];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kMeanThreads / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss[0] = static_cast<float>(partial[0] / static_cast<double>(rows));
}

// loss = (1/R) sum_r [logsumexp(z_r) - z_r[t_r]]  =>  dz_r[c] += dloss (p_r[c] - [c == t_r]) / R.
__global__ void cross_entropy_backward_kernel(float* dlogits, const float* dloss,
                                              const float* probs, const int32_t* targets,
                                              int64_t rows, int64_t classes) {
  const float scale = dloss[0] / static_cast<float>(rows);
  FT_GRID_STRIDE_LOOP(i, rows * classes) {
    float grad = dlogits[i] + scale * probs[i];
    if (i % classes == targets[i / classes]) grad -= scale;
    dlogits[i] = grad;
  }
}

}  // namespace

void softmax_cross_entropy_forward_cuda(float* loss, float* probs, float* row_losses,
                                        const float* logits, const int32_t* targets, int64_t rows,
                                        int64_t classes, CudaStream stream) {
  FT_CHECK(rows > 0 && rows <= 0x7fffffff, "cross_entropy: ", rows, " rows (one block each)");
  cross_entropy_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      probs, row_losses, logits, targets, classes);
  FT_CUDA_CHECK_LAUNCH();
  mean_row_losses_cuda(loss, row_losses, rows, stream);
}

void mean_row_losses_cuda(float* loss, const float* row_losses, int64_t rows, CudaStream stream) {
  mean_row_losses_kernel<<<1, kMeanThreads, 0, stream>>>(loss, row_losses, rows);
  FT_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy_backward_cuda(float* dlogits, const float* dloss, const float* probs,
                                         const int32_t* targets, int64_t rows, int64_t classes,
                                         CudaStream stream) {
  if (rows <= 0 || classes <= 0) return;
  cross_entropy_backward_kernel<<<cuda_grid_stride_blocks(rows * classes), kCudaThreadsPerBlock, 0,
                                  stream>>>(dlogits, dloss, probs, targets, rows, classes);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
