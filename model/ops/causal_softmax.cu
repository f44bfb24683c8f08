// Causal softmax on CUDA (see causal_softmax.h): one warp per row of T, lanes striding over the
// row, warp shuffles for the row max, sum and <P, dP>. The exp is core/math/fast_exp.h's, as in
// the CPU loops, so the two differ only in summation order.
#include "core/cuda/cuda_check.h"
#include "core/cuda/reduce.cuh"
#include "core/math/fast_exp.h"
#include "model/ops/causal_softmax.h"

namespace ft {
namespace {

constexpr int kWarpsPerBlock = 8;

// Row `row` is query t = row % T; entries s <= t are read, the rest of probs is written 0.
__global__ void causal_softmax_forward_kernel(float* probs, const float* scores, int64_t rows,
                                              int seq_len) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp
  const int lane = threadIdx.x % 32, t = static_cast<int>(row % seq_len);
  const float* s_row = scores + row * seq_len;
  float* p_row = probs + row * seq_len;
  float max_score = -INFINITY;
  for (int s = lane; s <= t; s += 32) max_score = fmaxf(max_score, s_row[s]);
  max_score = warp_max(max_score);
  float sum = 0.0f;
  for (int s = lane; s <= t; s += 32) {
    const float weight = fast_exp(s_row[s] - max_score);
    p_row[s] = weight;
    sum += weight;
  }
  const float inv_sum = 1.0f / warp_sum(sum);
  // Each lane rescales the entries it wrote itself, so no barrier is needed.
  for (int s = lane; s <= t; s += 32) p_row[s] *= inv_sum;
  for (int s = t + 1 + lane; s < seq_len; s += 32) p_row[s] = 0.0f;
}

// dS = P (dP - <P, dP>) for s <= t; with overwrite, 0 above the diagonal too.
__global__ void causal_softmax_backward_kernel(float* dscores, const float* dprobs,
                                               const float* probs, bool overwrite, int64_t rows,
                                               int seq_len) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32, t = static_cast<int>(row % seq_len);
  const float* p_row = probs + row * seq_len;
  const float* dp_row = dprobs + row * seq_len;
  float* ds_row = dscores + row * seq_len;
  float dot = 0.0f;
  for (int s = lane; s <= t; s += 32) dot += p_row[s] * dp_row[s];
  dot = warp_sum(dot);
  if (overwrite) {
    for (int s = lane; s <= t; s += 32) ds_row[s] = p_row[s] * (dp_row[s] - dot);
    for (int s = t + 1 + lane; s < seq_len; s += 32) ds_row[s] = 0.0f;
  } else {
    for (int s = lane; s <= t; s += 32) ds_row[s] += p_row[s] * (dp_row[s] - dot);
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void causal_softmax_forward_cuda(float* probs, const float* scores, int64_t rows, int seq_len,
                                 CudaStream stream) {
  if (rows <= 0) return;
  causal_softmax_forward_kernel<<<row_blocks(rows), kWarpsPerBlock * 32, 0, stream>>>(
      probs, scores, rows, seq_len);
  FT_CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward_cuda(float* dscores, const float* dprobs, const float* probs,
                                  bool overwrite, int64_t rows, int seq_len, CudaStream stream) {
  if (rows <= 0) return;
  causal_softmax_backward_kernel<<<row_blocks(rows), kWarpsPerBlock * 32, 0, stream>>>(
      dscores, dprobs, probs, overwrite, rows, seq_len);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
