// Launch geometry shared by the elementwise and row kernels of every op's .cu file.
// Elementwise kernels loop with a grid stride (i, i + gridDim*blockDim, ...), so one launch of a
// bounded grid covers any element count, including counts above 2^31.
// Thread safety: constants and pure functions.
#pragma once
#include <algorithm>
#include <cstdint>

namespace ft {

constexpr int kCudaThreadsPerBlock = 256;
// Enough blocks to fill an H200 (132 SMs) several times over; more only adds scheduling cost.
constexpr int64_t kCudaMaxBlocks = 132 * 16;

// Blocks for a grid-stride loop over `count` elements.
inline unsigned int cuda_grid_stride_blocks(int64_t count) {
  const int64_t blocks = (count + kCudaThreadsPerBlock - 1) / kCudaThreadsPerBlock;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks, kCudaMaxBlocks)));
}

}  // namespace ft

#if defined(__CUDACC__)
// The first index and the stride of a grid-stride loop, as int64 so large tensors cannot wrap.
#define FT_GRID_STRIDE_LOOP(index, count)                                           \
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       index < (count); index += static_cast<int64_t>(gridDim.x) * blockDim.x)
#endif
