// [dropout ->] residual add -> LayerNorm on CUDA: the kernels, then their launchers. One warp per
// row (8 rows per block): lane l writes columns l, l + 32, ... of the residual sum and then
// normalises that row through layernorm_math.h's warp helpers, reading back only its own writes.
// The keep decision is kernels/dropout_math.h's, on the element index r * C + c that DropoutOp
// and the CPU kernel hash, so the mask is the same bits on both devices. The weight and bias
// gradients are LayerNorm's column reduction (kernels/layernorm.cu), called by the op. A bf16
// `normed` (train.precision: bf16) is the same row rounded once as it is written
// (fusion/ops/layernorm_bf16_row.cuh), as the CPU rounds its fp32 row buffer.
#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "fusion/ops/layernorm_bf16_row.cuh"
#include "fusion/ops/residual_layernorm.h"
#include "kernels/dropout_math.h"
#include "kernels/layernorm_math.h"

namespace ft {
namespace {

constexpr int kRowsPerBlock = kCudaThreadsPerBlock / kLayerNormWarp;

struct RowStrides {
  int64_t out, normed, in, branch;  // floats between rows; each gradient shares its value's
};

__device__ inline int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLayerNormWarp;
}

// out = residual_in + (keep ? branch * scale : 0), then normed = LN(out). The row index is
// uniform in a warp, so whole warps leave past the last row and the shuffles see all lanes.
template <bool kMasked, typename Normed>
__global__ void residual_layernorm_forward_kernel(float* out, Normed* normed, uint8_t* keep_mask,
                                                  float* mean, float* rstd,
                                                  const float* residual_in, const float* branch,
                                                  const float* weight, const float* bias, float p,
                                                  float scale, const uint64_t* step_seed,
                                                  uint64_t salt, int64_t rows, int64_t channels,
                                                  RowStrides strides) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const uint64_t seed = kMasked ? *step_seed ^ salt : 0;
  const int lane = threadIdx.x % kLayerNormWarp;
  float* out_row = out + row * strides.out;
  const float* in_row = residual_in + row * strides.in;
  const float* branch_row = branch + row * strides.branch;
  for (int64_t i = lane; i < channels; i += kLayerNormWarp) {
    float added = branch_row[i];
    if (kMasked) {
      const int64_t element = row * channels + i;
      const bool keep = dropout_keep(seed, static_cast<uint64_t>(element), p);
      keep_mask[element] = keep ? 1 : 0;
      added = keep ? added * scale : 0.0f;
    }
    out_row[i] = in_row[i] + added;
  }
  float row_mean, row_rstd;
  layernorm_warp_row_forward_as(normed + row * strides.normed, &row_mean, &row_rstd, out_row,
                                weight, bias, channels, kLayerNormEps, lane);
  if (lane == 0) {
    mean[row] = row_mean;
    rstd[row] = row_rstd;
  }
}

// total = d_out + LN'(d normed) (layernorm_input_grad); d_in (+)= total, d_branch (+)= keep ?
// total * scale : 0, as backward_row in residual_layernorm.cpp; `=` for a fresh gradient.
template <bool kFreshIn, bool kFreshBranch, bool kMasked>
__global__ void residual_layernorm_backward_input_kernel(
    float* d_in, float* d_branch, const float* d_out, const float* d_normed, const float* out,
    const float* weight, const uint8_t* keep_mask, const float* mean, const float* rstd,
    float scale, int64_t rows, int64_t channels, RowStrides strides) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = threadIdx.x % kLayerNormWarp;
  const float row_mean = mean[row], row_rstd = rstd[row];
  const float* out_row = out + row * strides.out;
  const float* d_out_row = d_out + row * strides.out;
  const float* d_normed_row = d_normed + row * strides.normed;
  float* d_in_row = d_in + row * strides.in;
  float* d_branch_row = d_branch + row * strides.branch;
  const uint8_t* mask_row = kMasked ? keep_mask + row * channels : nullptr;
  float g_mean, g_xhat_mean;
  layernorm_warp_row_backward_means(&g_mean, &g_xhat_mean, d_normed_row, out_row, weight, row_mean,
                                    row_rstd, channels, lane);
  for (int64_t i = lane; i < channels; i += kLayerNormWarp) {
    const float total =
        d_out_row[i] + layernorm_input_grad(d_normed_row[i], weight[i], out_row[i], row_mean,
                                            row_rstd, g_mean, g_xhat_mean);
    const float to_branch = kMasked ? (mask_row[i] ? total * scale : 0.0f) : total;
    d_in_row[i] = kFreshIn ? total : d_in_row[i] + total;
    d_branch_row[i] = kFreshBranch ? to_branch : d_branch_row[i] + to_branch;
  }
}

using BackwardKernel = void (*)(float*, float*, const float*, const float*, const float*,
                                const float*, const uint8_t*, const float*, const float*, float,
                                int64_t, int64_t, RowStrides);

BackwardKernel backward_kernel(bool fresh_in, bool fresh_branch, bool masked) {
  static const BackwardKernel table[8] = {
      residual_layernorm_backward_input_kernel<false, false, false>,
      residual_layernorm_backward_input_kernel<false, false, true>,
      residual_layernorm_backward_input_kernel<false, true, false>,
      residual_layernorm_backward_input_kernel<false, true, true>,
      residual_layernorm_backward_input_kernel<true, false, false>,
      residual_layernorm_backward_input_kernel<true, false, true>,
      residual_layernorm_backward_input_kernel<true, true, false>,
      residual_layernorm_backward_input_kernel<true, true, true>};
  return table[(fresh_in ? 4 : 0) + (fresh_branch ? 2 : 0) + (masked ? 1 : 0)];
}

unsigned int row_blocks(int64_t rows) {
  FT_CHECK(rows > 0 && rows <= static_cast<int64_t>(0x7fffffff) * kRowsPerBlock,
           "residual_layernorm (cuda): ", rows, " rows do not fit the launch grid");
  return static_cast<unsigned int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// One launcher body for both types of `normed`.
template <typename Normed>
void launch_residual_layernorm_forward(float* out, Normed* normed, uint8_t* keep_mask, float* mean,
                                       float* rstd, const float* residual_in, const float* branch,
                                       const float* weight, const float* bias, float dropout_p,
                                       const uint64_t* step_seed, uint64_t salt, int64_t rows,
                                       int64_t channels, const RowStrides& strides,
                                       CudaStream stream) {
  const unsigned int blocks = row_blocks(rows);
  if (dropout_p > 0.0f) {
    residual_layernorm_forward_kernel<true, Normed><<<blocks, kCudaThreadsPerBlock, 0, stream>>>(
        out, normed, keep_mask, mean, rstd, residual_in, branch, weight, bias, dropout_p,
        dropout_scale(dropout_p), step_seed, salt, rows, channels, strides);
    FT_CUDA_CHECK_LAUNCH();
  } else {
    residual_layernorm_forward_kernel<false, Normed><<<blocks, kCudaThreadsPerBlock, 0, stream>>>(
        out, normed, nullptr, mean, rstd, residual_in, branch, weight, bias, 0.0f, 1.0f, nullptr, 0,
        rows, channels, strides);
    FT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void residual_layernorm_forward_cuda(float* out, float* normed, uint8_t* keep_mask, float* mean,
                                     float* rstd, const float* residual_in, const float* branch,
                                     const float* weight, const float* bias, float dropout_p,
                                     const uint64_t* step_seed, uint64_t salt, int64_t rows,
                                     int64_t channels, int64_t out_stride, int64_t normed_stride,
                                     int64_t in_stride, int64_t branch_stride, CudaStream stream) {
  launch_residual_layernorm_forward(out, normed, keep_mask, mean, rstd, residual_in, branch, weight,
                                    bias, dropout_p, step_seed, salt, rows, channels,
                                    {out_stride, normed_stride, in_stride, branch_stride}, stream);
}

void residual_layernorm_forward_cuda(float* out, bf16_bits* normed, uint8_t* keep_mask, float* mean,
                                     float* rstd, const float* residual_in, const float* branch,
                                     const float* weight, const float* bias, float dropout_p,
                                     const uint64_t* step_seed, uint64_t salt, int64_t rows,
                                     int64_t channels, int64_t out_stride, int64_t normed_stride,
                                     int64_t in_stride, int64_t branch_stride, CudaStream stream) {
  launch_residual_layernorm_forward(out, normed, keep_mask, mean, rstd, residual_in, branch, weight,
                                    bias, dropout_p, step_seed, salt, rows, channels,
                                    {out_stride, normed_stride, in_stride, branch_stride}, stream);
}

void residual_layernorm_backward_input_cuda(float* d_in, float* d_branch, const float* d_out,
                                            const float* d_normed, const float* out,
                                            const float* weight, const uint8_t* keep_mask,
                                            const float* mean, const float* rstd, float dropout_p,
                                            bool fresh_in, bool fresh_branch, int64_t rows,
                                            int64_t channels, int64_t out_stride,
                                            int64_t normed_stride, int64_t in_stride,
                                            int64_t branch_stride, CudaStream stream) {
  const RowStrides strides{out_stride, normed_stride, in_stride, branch_stride};
  const bool masked = dropout_p > 0.0f;
  backward_kernel(fresh_in, fresh_branch,
                  masked)<<<row_blocks(rows), kCudaThreadsPerBlock, 0, stream>>>(
      d_in, d_branch, d_out, d_normed, out, weight, keep_mask, mean, rstd,
      masked ? dropout_scale(dropout_p) : 1.0f, rows, channels, strides);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
