// AddReluOp on CUDA: one elementwise pass each way, over relu_value / relu_gradient
// (model/ops/relu.h), the helpers of the CPU loops.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "fusion/ops/add_relu.h"
#include "model/ops/relu.h"

namespace ft {
namespace {

__global__ void add_relu_forward_kernel(float* y, const float* a, const float* b, int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    y[i] = relu_value(a[i] + b[i]);
  }
}

// Both summands get ds = dy [y > 0]; each is written (=) when fresh, else accumulated.
template <bool kFreshA, bool kFreshB>
__global__ void add_relu_backward_kernel(float* da, float* db, const float* dy, const float* y,
                                         int64_t numel) {
  FT_GRID_STRIDE_LOOP(i, numel) {
    const float ds = relu_gradient(dy[i], y[i]);
    da[i] = kFreshA ? ds : da[i] + ds;
    db[i] = kFreshB ? ds : db[i] + ds;
  }
}

}  // namespace

void add_relu_forward_cuda(float* y, const float* a, const float* b, int64_t numel,
                           CudaStream stream) {
  if (numel <= 0) return;
  add_relu_forward_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      y, a, b, numel);
  FT_CUDA_CHECK_LAUNCH();
}

void add_relu_backward_cuda(float* da, float* db, const float* dy, const float* y, int64_t numel,
                            bool da_fresh, bool db_fresh, CudaStream stream) {
  if (numel <= 0) return;
  // One launch site for the four instantiations, so its check counts exactly one launch.
  const auto kernel = da_fresh ? (db_fresh ? add_relu_backward_kernel<true, true>
                                           : add_relu_backward_kernel<true, false>)
                               : (db_fresh ? add_relu_backward_kernel<false, true>
                                           : add_relu_backward_kernel<false, false>);
  kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(da, db, dy, y, numel);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
