// GlobalAvgPoolOp on CUDA over NHWC. Forward: one thread per (sample, channel) adds the
// positions in order in float, as the CPU loop, and threads of a warp read consecutive channels
// of a row, so loads coalesce. Backward: elementwise, dx += dy[b, c] / positions.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "model/ops/global_avg_pool.h"

namespace ft {
namespace {

__global__ void global_avg_pool_forward_kernel(float* y, const float* x, int batch,
                                               int64_t positions, int channels,
                                               float inv_positions) {
  FT_GRID_STRIDE_LOOP(i, static_cast<int64_t>(batch) * channels) {
    const int64_t b = i / channels;
    const int64_t c = i % channels;
    const float* sample = x + b * positions * channels + c;
    float sum = 0.0f;
    for (int64_t p = 0; p < positions; ++p) sum += sample[p * channels];
    y[i] = sum * inv_positions;
  }
}

__global__ void global_avg_pool_backward_kernel(float* dx, const float* dy, int64_t positions,
                                                int channels, int64_t numel, float inv_positions) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const int64_t b = i / (positions * channels);
    const int64_t c = i % channels;
    dx[i] += dy[b * channels + c] * inv_positions;
  }
}

}  // namespace

void global_avg_pool_forward_cuda(float* y, const float* x, int batch, int64_t positions,
                                  int channels, CudaStream stream) {
  const int64_t outputs = static_cast<int64_t>(batch) * channels;
  if (outputs <= 0 || positions <= 0) return;
  global_avg_pool_forward_kernel<<<cuda_grid_stride_blocks(outputs), kCudaThreadsPerBlock, 0,
                                   stream>>>(y, x, batch, positions, channels,
                                             1.0f / static_cast<float>(positions));
  FT_CUDA_CHECK_LAUNCH();
}

void global_avg_pool_backward_cuda(float* dx, const float* dy, int batch, int64_t positions,
                                   int channels, CudaStream stream) {
  const int64_t numel = static_cast<int64_t>(batch) * positions * channels;
  if (numel <= 0) return;
  global_avg_pool_backward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0,
                                    stream>>>(dx, dy, positions, channels, numel,
                                              1.0f / static_cast<float>(positions));
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
