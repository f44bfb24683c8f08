// Fused classifier on CUDA (see classifier.h): the logits GEMM through gemm_cuda, then one block
// per row that finds the row's max and normaliser in one pass with the online softmax of
// kernels/online_softmax.h (each thread over a strided share, then merged across the block),
// and writes dlogits = (softmax - onehot) / rows with the same exp as the CPU loop; the loss is
// reduced by mean_row_losses_cuda, in a fixed order. In bf16 the GEMMs read bf16 x and wte, and
// backward rounds dloss · dlogits once (core/math/bf16_math.h) for both of its GEMMs.
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "core/gemm.h"
#include "core/math/bf16_math.h"
#include "fusion/ops/classifier.h"
#include "kernels/online_softmax.h"
#include "model/ops/cross_entropy.h"

namespace ft {
namespace {

constexpr int kRowThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly merge: lanes a and a ^ offset merge the same two states (merge is commutative bit
// for bit), so every lane ends with the same state.
__device__ OnlineSoftmax warp_merge(OnlineSoftmax state) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    OnlineSoftmax other;
    other.max = __shfl_xor_sync(kFullMask, state.max, offset);
    other.sum = __shfl_xor_sync(kFullMask, state.sum, offset);
    state = online_softmax_merge(state, other);
  }
  return state;
}

__device__ OnlineSoftmax block_merge(OnlineSoftmax state) {
  __shared__ float partial_max[32], partial_sum[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  state = warp_merge(state);
  if (lane == 0) {
    partial_max[warp] = state.max;
    partial_sum[warp] = state.sum;
  }
  __syncthreads();
  OnlineSoftmax warp_state;  // empty for lanes past the warp count
  if (lane < static_cast<int>(blockDim.x / 32)) {
    warp_state.max = partial_max[lane];
    warp_state.sum = partial_sum[lane];
  }
  return warp_merge(warp_state);
}

// loss_r = logsumexp(z_r) - z_r[t_r]  =>  dz_r[c] = (p_r[c] - [c == t_r]) / R.
__global__ void classifier_softmax_kernel(float* dlogits, float* row_losses, const float* logits,
                                          const int32_t* targets, int64_t vocab, float inv_rows) {
  const int64_t row = blockIdx.x;
  const float* logit_row = logits + row * vocab;
  OnlineSoftmax state;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) online_softmax_add(state, logit_row[c]);
  state = block_merge(state);
  const int32_t target = targets[row];
  if (dlogits != nullptr) {
    float* dlogit_row = dlogits + row * vocab;
    const float scale = inv_rows / state.sum;
    for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
      float grad = online_softmax_weight(logit_row[c], state.max) * scale;
      if (c == target) grad -= inv_rows;
      dlogit_row[c] = grad;
    }
  }
  if (threadIdx.x == 0)
    row_losses[row] =
        static_cast<float>(log(static_cast<double>(state.sum)) + state.max - logit_row[target]);
}

// out = dloss[0] * in.
__global__ void scale_by_dloss_kernel(float* out, const float* in, const float* dloss,
                                      int64_t numel) {
  const float scale = dloss[0];
  FT_GRID_STRIDE_LOOP(i, numel) {
    out[i] = scale * in[i];
  }
}

// out = bf16(dloss[0] * in): the bf16 GEMM operand standing for the scaled logits' gradient.
__global__ void round_scaled_by_dloss_kernel(bf16_bits* out, const float* in, const float* dloss,
                                             int64_t numel) {
  const float scale = dloss[0];
  FT_GRID_STRIDE_LOOP(i, numel) {
    out[i] = float_to_bf16(scale * in[i]);
  }
}

// dx (= or +=) dloss[0] * product.
__global__ void add_scaled_by_dloss_kernel(float* dx, const float* product, const float* dloss,
                                           bool overwrite, int64_t numel) {
  const float scale = dloss[0];
  FT_GRID_STRIDE_LOOP(i, numel) {
    dx[i] = overwrite ? scale * product[i] : dx[i] + scale * product[i];
  }
}

// The two weight-side GEMMs of backward, for fp32 and bf16 operands alike (G: dlogits, scaled):
// logits = x wte^T  =>  dwte += G^T x   ([V, rows] · [rows, C])
GemmArgs dwte_gemm_args(int64_t rows, int64_t channels, int64_t vocab) {
  GemmArgs args;
  args.m = vocab;
  args.n = channels;
  args.k = rows;
  args.transpose_a = true;  // G stored [rows, V] = [K, M]
  args.accumulate = true;
  return args;
}

//                     dx (+|=) G wte   ([rows, V] · [V, C])
GemmArgs dx_gemm_args(int64_t rows, int64_t channels, int64_t vocab, bool accumulate) {
  GemmArgs args;
  args.m = rows;
  args.n = channels;
  args.k = vocab;
  args.accumulate = accumulate;
  return args;
}

}  // namespace

void classifier_forward_cuda(float* loss, float* logits, float* dlogits, float* row_losses,
                             GemmOperand x, GemmOperand wte, const int32_t* targets, int64_t rows,
                             int64_t channels, int64_t vocab, CudaStream stream) {
  FT_CHECK(rows > 0 && rows <= 0x7fffffff, "classifier: ", rows, " rows (one block each)");
  GemmArgs args;
  args.m = rows;
  args.n = vocab;
  args.k = channels;
  args.transpose_b = true;  // wte is stored [V, C] = [N, K]
  gemm_cuda(logits, x, wte, args, stream);
  classifier_softmax_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      dlogits, row_losses, logits, targets, vocab, 1.0f / static_cast<float>(rows));
  FT_CUDA_CHECK_LAUNCH();
  mean_row_losses_cuda(loss, row_losses, rows, stream);
}

// Every step below is on `stream`, so the dwte GEMM has read the scaled x before the dx GEMM
// overwrites the scratch with dlogits wte.
void classifier_backward_cuda(float* dx, bool overwrite_dx, float* dwte, float* scratch,
                              const float* dloss, const float* dlogits, const float* x,
                              const float* wte, int64_t rows, int64_t channels, int64_t vocab,
                              CudaStream stream) {
  const int64_t numel = rows * channels;
  // logits = x wte^T  =>  dwte += dloss dlogits^T x   ([V, rows] · [rows, C])
  scale_by_dloss_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      scratch, x, dloss, numel);
  FT_CUDA_CHECK_LAUNCH();
  gemm_cuda(dwte, dlogits, scratch, dwte_gemm_args(rows, channels, vocab), stream);
  if (dx == nullptr) return;
  //                      dx (+|=) dloss dlogits wte   ([rows, V] · [V, C])
  gemm_cuda(scratch, dlogits, wte, dx_gemm_args(rows, channels, vocab, false), stream);
  add_scaled_by_dloss_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      dx, scratch, dloss, overwrite_dx, numel);
  FT_CUDA_CHECK_LAUNCH();
}

// With G = bf16(dloss dlogits), rounded once: dwte += G^T x and dx (=|+=) G wte, both plain
// accumulate-or-write GEMMs, in stream order after the rounding.
void classifier_backward_bf16_cuda(float* dx, bool overwrite_dx, float* dwte,
                                   bf16_bits* dlogits_bf16, const float* dloss,
                                   const float* dlogits, const bf16_bits* x, const bf16_bits* wte,
                                   int64_t rows, int64_t channels, int64_t vocab,
                                   CudaStream stream) {
  const int64_t numel = rows * vocab;
  round_scaled_by_dloss_kernel<<<cuda_grid_stride_blocks(numel), kCudaThreadsPerBlock, 0, stream>>>(
      dlogits_bf16, dlogits, dloss, numel);
  FT_CUDA_CHECK_LAUNCH();
  // logits = x wte^T  =>  dwte += dlogits^T x   ([V, rows] · [rows, C])
  gemm_cuda(dwte, dlogits_bf16, x, dwte_gemm_args(rows, channels, vocab), stream);
  if (dx == nullptr) return;
  //                      dx (+|=) dlogits wte   ([rows, V] · [V, C])
  gemm_cuda(dx, dlogits_bf16, wte, dx_gemm_args(rows, channels, vocab, !overwrite_dx), stream);
}

}  // namespace ft
