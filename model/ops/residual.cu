// Residual add on CUDA: the kernels, then their launchers. Elementwise, grid-stride.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "model/ops/residual.h"

namespace ft {
namespace {

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    out[i] = a[i] + b[i];
  }
}

// The gradient of a sum passes unchanged to both summands; `=` into a fresh gradient, whose
// buffer holds stale data, `+=` otherwise.
template <bool kFreshA, bool kFreshB>
__global__ void residual_backward_kernel(float* da, float* db, const float* dout, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const float g = dout[i];
    da[i] = kFreshA ? g : da[i] + g;
    db[i] = kFreshB ? g : db[i] + g;
  }
}

}  // namespace

void residual_forward_cuda(float* out, const float* a, const float* b, int64_t numel,
                           CudaStream stream) {
  if (numel <= 0) return;
  residual_forward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      out, a, b, numel);
  FT_CUDA_CHECK_LAUNCH();
}

void residual_backward_cuda(float* da, float* db, const float* dout, int64_t numel, bool fresh_a,
                            bool fresh_b, CudaStream stream) {
  if (numel <= 0) return;
  // One launch site for the four instantiations, so its check counts exactly one launch.
  const auto kernel =
      fresh_a
          ? (fresh_b ? residual_backward_kernel<true, true> : residual_backward_kernel<true, false>)
          : (fresh_b ? residual_backward_kernel<false, true>
                     : residual_backward_kernel<false, false>);
  kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(da, db, dout, numel);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
