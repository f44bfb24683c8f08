// Token + position embedding on CUDA: the kernels, then their launchers.
// Backward has no atomics (see embedding.h): the table rows a batch touches are known from the
// host's token ids, grouped by token in stage(), so each output element is owned by one thread that
// adds its contributions in the CPU loop's order, and the result is the CPU's bits on every run.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "model/ops/embedding.h"

namespace ft {
namespace {

// x[row, c] = wte[tokens[row], c] + wpe[row % T, c].
__global__ void embedding_forward_kernel(float* x, const int32_t* tokens, const float* wte,
                                         const float* wpe, int64_t rows, int seq_len,
                                         int channels) {
  FT_GRID_STRIDE_LOOP(i, rows * channels) {
    const int64_t row = i / channels;
    const int64_t c = i - row * channels;
    x[i] =
        wte[static_cast<int64_t>(tokens[row]) * channels + c] + wpe[(row % seq_len) * channels + c];
  }
}

// Grid (capacity, column blocks): dwte[d_k, c] += dx[r, c] for token d_k's rows r in ascending
// order (rows_by_token's layout is in embedding.h); blocks k >= distinct have no token.
__global__ void embedding_token_grad_kernel(float* dwte, const float* dx,
                                            const int32_t* rows_by_token, int capacity,
                                            int channels) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int k = blockIdx.x;
  if (c >= channels || k >= rows_by_token[0]) return;
  const int32_t* ids = rows_by_token + 1;
  const int32_t* starts = ids + capacity;
  const int32_t* rows = starts + capacity + 1;
  float* target = dwte + static_cast<int64_t>(ids[k]) * channels + c;
  float sum = *target;
  for (int32_t j = starts[k]; j < starts[k + 1]; ++j)
    sum += dx[static_cast<int64_t>(rows[j]) * channels + c];
  *target = sum;
}

// dwpe[t, c] += dx[b, t, c] for b = 0, 1, ..., batch - 1.
__global__ void embedding_position_grad_kernel(float* dwpe, const float* dx, int batch, int seq_len,
                                               int channels) {
  const int64_t position_elements = static_cast<int64_t>(seq_len) * channels;
  FT_GRID_STRIDE_LOOP(i, position_elements) {
    float sum = dwpe[i];
    for (int b = 0; b < batch; ++b) sum += dx[b * position_elements + i];
    dwpe[i] = sum;
  }
}

}  // namespace

void embedding_forward_cuda(float* x, const int32_t* tokens, const float* wte, const float* wpe,
                            int batch, int seq_len, int channels, CudaStream stream) {
  const int64_t rows = static_cast<int64_t>(batch) * seq_len;
  if (rows <= 0 || channels <= 0) return;
  embedding_forward_kernel<<<cuda_grid_stride_blocks(rows * channels), kCudaThreadsPerBlock, 0,
                             stream>>>(x, tokens, wte, wpe, rows, seq_len, channels);
  FT_CUDA_CHECK_LAUNCH();
}

void embedding_backward_cuda(float* dwte, float* dwpe, const float* dx,
                             const int32_t* rows_by_token, int capacity, int batch, int seq_len,
                             int channels, CudaStream stream) {
  if (batch <= 0 || seq_len <= 0 || channels <= 0) return;
  if (capacity > 0) {
    const dim3 grid(
        static_cast<unsigned int>(capacity),
        static_cast<unsigned int>((channels + kCudaThreadsPerBlock - 1) / kCudaThreadsPerBlock));
    embedding_token_grad_kernel<<<grid, kCudaThreadsPerBlock, 0, stream>>>(dwte, dx, rows_by_token,
                                                                           capacity, channels);
    FT_CUDA_CHECK_LAUNCH();
  }
  const int64_t position_elements = static_cast<int64_t>(seq_len) * channels;
  embedding_position_grad_kernel<<<cuda_grid_stride_blocks(position_elements), kCudaThreadsPerBlock,
                                   0, stream>>>(dwpe, dx, batch, seq_len, channels);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
