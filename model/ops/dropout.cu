// Inverted dropout on CUDA: the kernels, then their launchers. The keep test is
// kernels/dropout_math.h's, which the CPU loop also calls, so the mask is the same bits on both
// devices for the same (seed, element index). The kernel reads the step's seed from device memory
// (Workspace::device_dropout_seed), so a replayed CUDA graph draws each step's mask.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/dropout_math.h"
#include "model/ops/dropout.h"

namespace ft {
namespace {

__global__ void dropout_forward_kernel(float* y, uint8_t* keep_mask, const float* x, float p,
                                       float scale, const uint64_t* step_seed, uint64_t salt,
                                       int64_t numel) {
  const uint64_t seed = *step_seed ^ salt;
  FT_GRID_STRIDE_LOOP(i, numel) {
    const bool keep = dropout_keep(seed, static_cast<uint64_t>(i), p);
    keep_mask[i] = keep ? 1 : 0;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
}

// y = x * keep * scale is linear in x with a fixed mask: dx += dy * keep * scale. Without a mask
// (p == 0, y = x) dx += dy.
__global__ void dropout_backward_kernel(float* dx, const float* dy, const uint8_t* keep_mask,
                                        float scale, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    dx[i] += keep_mask == nullptr ? dy[i] : (keep_mask[i] ? dy[i] * scale : 0.0f);
  }
}

}  // namespace

void dropout_forward_cuda(float* y, uint8_t* keep_mask, const float* x, float p,
                          const uint64_t* step_seed, uint64_t salt, int64_t numel,
                          CudaStream stream) {
  if (numel <= 0) return;
  dropout_forward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      y, keep_mask, x, p, dropout_scale(p), step_seed, salt, numel);
  FT_CUDA_CHECK_LAUNCH();
}

void dropout_backward_cuda(float* dx, const float* dy, const uint8_t* keep_mask, float p,
                           int64_t numel, CudaStream stream) {
  if (numel <= 0) return;
  dropout_backward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      dx, dy, keep_mask, keep_mask == nullptr ? 1.0f : dropout_scale(p), numel);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
