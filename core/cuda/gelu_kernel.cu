// GELU forward and backward kernels. Each thread handles elements i, i + stride, ... so one
// launch of a bounded grid covers any n, including n above 2^31.
#include <algorithm>

#include "core/cuda/cuda_check.h"
#include "core/cuda/gelu_kernel.h"
#include "core/math/gelu.h"

namespace ft {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill an H200 (132 SMs) several times over; more only adds scheduling cost.
constexpr int64_t kMaxBlocks = 132 * 16;

__global__ void gelu_forward_kernel(float* out, const float* in, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = gelu_tanh(in[i]);
  }
}

// Chain rule: dL/dx = dL/dy * dy/dx, with dy/dx from gelu_tanh_grad. The += keeps gradients that
// reach x through other ops.
__global__ void gelu_backward_kernel(float* din, const float* in, const float* dout, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    din[i] += dout[i] * gelu_tanh_grad(in[i]);
  }
}

unsigned int block_count(int64_t n) {
  const int64_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned int>(std::min(blocks, kMaxBlocks));
}

}  // namespace

void gelu_forward_cuda(float* out, const float* in, int64_t n, cudaStream_t stream) {
  FT_CHECK(n >= 0, "gelu_forward_cuda: n = ", n);
  if (n == 0) return;
  gelu_forward_kernel<<<block_count(n), kThreadsPerBlock, 0, stream>>>(out, in, n);
  FT_CUDA_CHECK_LAUNCH();
}

void gelu_backward_cuda(float* din, const float* in, const float* dout, int64_t n,
                        cudaStream_t stream) {
  FT_CHECK(n >= 0, "gelu_backward_cuda: n = ", n);
  if (n == 0) return;
  gelu_backward_kernel<<<block_count(n), kThreadsPerBlock, 0, stream>>>(din, in, dout, n);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
