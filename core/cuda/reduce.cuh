// Warp and block reductions of the row kernels (softmax, cross-entropy, attention). The xor
// butterfly leaves the same result, bit for bit, in every lane, so a warp's lanes agree without a
// broadcast; the order of additions is fixed, so results do not depend on scheduling.
// Device code only: include from .cu files.
#pragma once
#include <cmath>

namespace ft {

constexpr unsigned kCudaFullWarpMask = 0xffffffffu;

__device__ inline float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = fmaxf(x, __shfl_xor_sync(kCudaFullWarpMask, x, offset));
  return x;
}

__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x += __shfl_xor_sync(kCudaFullWarpMask, x, offset);
  return x;
}

// The block's maximum or sum, returned to every thread. `partials` holds one float per warp in
// shared memory; the first barrier keeps an earlier reduction's readers off it.
__device__ inline float block_max(float x, float* partials) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) partials[warp] = x;
  __syncthreads();
  return warp_max(lane < static_cast<int>(blockDim.x / 32) ? partials[lane] : -INFINITY);
}

__device__ inline float block_sum(float x, float* partials) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  x = warp_sum(x);
  __syncthreads();
  if (lane == 0) partials[warp] = x;
  __syncthreads();
  return warp_sum(lane < static_cast<int>(blockDim.x / 32) ? partials[lane] : 0.0f);
}

}  // namespace ft
