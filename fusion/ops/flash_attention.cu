// Fused causal attention on CUDA (see flash_attention.h), fp32 on CUDA cores. Every kernel works
// on 32 x 32 tiles, query rows x keys, of one (b, h), staged in shared memory with rows padded to
// head_dim + 1 floats: a warp whose lanes walk 32 different rows of a tile along d then hits 32
// different banks (head_dim even). The CPU kernel's `tile` does not apply; the tile is fixed.
//   forward: block per (b, h, query tile); a warp owns 4 query rows, lane c the key c of each key
//     tile, and runs the online softmax of kernels/online_softmax.h over the key tiles (the
//     helpers the CPU kernel calls), the output row spread over the lanes (d = lane + 32 x).
//   backward (FlashAttention-2), without atomics so it is reproducible: D_t = <dY_t, Y_t> first,
//     then a kernel per key tile that walks the query rows below it for dK and dV, and one per
//     query tile that walks the key tiles left of it for dQ; both recompute P = exp(S - L) and
//     dS = scale P (dP - D) tile by tile with the same device function.
#include "core/cuda/cuda_check.h"
#include "core/cuda/reduce.cuh"
#include "fusion/ops/flash_attention.h"
#include "kernels/online_softmax.h"

namespace ft {
namespace {

constexpr int kTile = 32;  // query rows and keys per tile: one key per lane
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = kTile / kWarps;  // the forward's rows, the backward's rows or keys
constexpr int kMaxHeadDim = 128;
constexpr int kDimsPerLane = kMaxHeadDim / 32;
// Above the 48 KiB every kernel may use, dynamic shared memory must be granted per kernel.
constexpr size_t kDefaultSharedBytes = 48 * 1024;

// Where head h of sequence b starts in a [B*T, C] activation with `stride` floats per row.
struct HeadOffsets {
  int64_t q, k, v, y;
};

__device__ HeadOffsets head_offsets(const AttentionStrides& strides, int bh, int seq_len,
                                    int n_head, int head_dim) {
  const int64_t first_row = static_cast<int64_t>(bh / n_head) * seq_len;
  const int64_t column = static_cast<int64_t>(bh % n_head) * head_dim;
  return {first_row * strides.q + column, first_row * strides.k + column,
          first_row * strides.v + column, first_row * strides.y + column};
}

// tile[r][d] = scale * rows[(first + r) * stride + d] for the rows below seq_len, 0 past it.
__device__ void load_tile(float* tile, const float* rows, int64_t stride, int first, int seq_len,
                          int head_dim, float scale) {
  const int ld = head_dim + 1;
  for (int e = threadIdx.x; e < kTile * head_dim; e += kThreads) {
    const int r = e / head_dim, d = e % head_dim;
    tile[r * ld + d] =
        first + r < seq_len ? scale * rows[static_cast<int64_t>(first + r) * stride + d] : 0.0f;
  }
}

__global__ void flash_attention_forward_kernel(float* y, float* lse, const float* q, const float* k,
                                               const float* v, AttentionStrides strides,
                                               int seq_len, int n_head, int head_dim, float scale) {
  extern __shared__ float shared[];
  const int ld = head_dim + 1;
  float* q_tile = shared;  // scaled by 1/sqrt(hd), as the CPU kernel's q_scaled
  float* k_tile = q_tile + kTile * ld;
  float* v_tile = k_tile + kTile * ld;
  const int bh = blockIdx.x, i0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const HeadOffsets at = head_offsets(strides, bh, seq_len, n_head, head_dim);
  load_tile(q_tile, q + at.q, strides.q, i0, seq_len, head_dim, scale);
  OnlineSoftmax state[kRowsPerWarp];
  float out[kRowsPerWarp][kDimsPerLane] = {};
  // Causal: key tiles past the query tile's last row contribute nothing.
  const int last_row = min(i0 + kTile, seq_len) - 1;
  for (int j0 = 0; j0 <= last_row; j0 += kTile) {
    __syncthreads();  // the previous tiles are read
    load_tile(k_tile, k + at.k, strides.k, j0, seq_len, head_dim, 1.0f);
    load_tile(v_tile, v + at.v, strides.v, j0, seq_len, head_dim, 1.0f);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp * kRowsPerWarp + i, t = i0 + r;
      if (t >= seq_len || j0 > t) continue;  // the same for the whole warp
      const bool visible = j0 + lane <= t;
      float score = -INFINITY;
      if (visible) {
        score = 0.0f;
        for (int d = 0; d < head_dim; ++d) score += q_tile[r * ld + d] * k_tile[lane * ld + d];
      }
      const float rescale = online_softmax_rescale(state[i], warp_max(score));
      const float weight = visible ? online_softmax_weight(score, state[i].max) : 0.0f;
      online_softmax_accumulate(state[i], rescale, warp_sum(weight));
      const int keys = min(kTile, t - j0 + 1);
#pragma unroll
      for (int x = 0; x < kDimsPerLane; ++x) out[i][x] *= rescale;
      for (int c = 0; c < keys; ++c) {
        const float key_weight = __shfl_sync(kCudaFullWarpMask, weight, c);
#pragma unroll
        for (int x = 0; x < kDimsPerLane; ++x) {
          const int d = lane + 32 * x;
          if (d < head_dim) out[i][x] += key_weight * v_tile[c * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int t = i0 + warp * kRowsPerWarp + i;
    if (t >= seq_len) continue;
    const float inv_sum = 1.0f / state[i].sum;
    float* y_row = y + at.y + static_cast<int64_t>(t) * strides.y;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) {
      const int d = lane + 32 * x;
      if (d < head_dim) y_row[d] = out[i][x] * inv_sum;
    }
    if (lane == 0)
      lse[static_cast<int64_t>(bh) * seq_len + t] = online_softmax_log_sum_exp(state[i]);
  }
}

// delta[bh * T + t] = <dY_t, Y_t> over head h's columns: one warp per row.
__global__ void attention_delta_kernel(float* delta, const float* dy, const float* y,
                                       int64_t y_stride, int64_t head_rows, int seq_len, int n_head,
                                       int head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= head_rows) return;  // the whole warp
  const int lane = threadIdx.x % 32;
  const int64_t bh = row / seq_len, t = row % seq_len;
  const int64_t at = ((bh / n_head) * seq_len + t) * y_stride + (bh % n_head) * head_dim;
  float dot = 0.0f;
  for (int d = lane; d < head_dim; d += 32) dot += dy[at + d] * y[at + d];
  dot = warp_sum(dot);
  if (lane == 0) delta[row] = dot;
}

// The backward's shared memory: q, dy, k, v tiles [kTile][hd + 1], then probs and dscores
// [kTile][kTile], then lse and delta of the query tile.
struct BackwardTiles {
  float *q, *dy, *k, *v, *probs, *dscores, *lse, *delta;
};

__device__ BackwardTiles backward_tiles(float* shared, int head_dim) {
  const int tile_floats = kTile * (head_dim + 1);
  BackwardTiles tiles;
  tiles.q = shared;
  tiles.dy = tiles.q + tile_floats;
  tiles.k = tiles.dy + tile_floats;
  tiles.v = tiles.k + tile_floats;
  tiles.probs = tiles.v + tile_floats;
  tiles.dscores = tiles.probs + kTile * kTile;
  tiles.lse = tiles.dscores + kTile * kTile;
  tiles.delta = tiles.lse + kTile;
  return tiles;
}

// Loads query rows [i0, i0 + kTile) of q, dy, lse and delta (0 past seq_len).
__device__ void load_query_tiles(const BackwardTiles& tiles, const float* q, const float* dy,
                                 const float* lse, const float* delta,
                                 const AttentionStrides& strides, const HeadOffsets& at, int bh,
                                 int i0, int seq_len, int head_dim) {
  load_tile(tiles.q, q + at.q, strides.q, i0, seq_len, head_dim, 1.0f);
  load_tile(tiles.dy, dy + at.y, strides.y, i0, seq_len, head_dim, 1.0f);
  if (threadIdx.x < kTile) {
    const int t = i0 + threadIdx.x;
    const int64_t row = static_cast<int64_t>(bh) * seq_len + t;
    tiles.lse[threadIdx.x] = t < seq_len ? lse[row] : 0.0f;
    tiles.delta[threadIdx.x] = t < seq_len ? delta[row] : 0.0f;
  }
}

// probs[r][c] = P_ts = exp(S_ts - L_t) and dscores[r][c] = scale P_ts (dP_ts - D_t), dP_ts =
// <dY_t, V_s>, for t = i0 + r, s = j0 + c; 0 where s > t or past seq_len. The score is
// sum_d (scale q_d) k_d, as on the CPU, so P matches the forward's normalised probabilities.
__device__ void tile_probs_and_dscores(const BackwardTiles& tiles, int i0, int j0, int seq_len,
                                       int head_dim, float scale) {
  const int ld = head_dim + 1;
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;  // a warp: one query row, 32 keys
    const int t = i0 + r, s = j0 + c;
    float prob = 0.0f, dscore = 0.0f;
    if (t < seq_len && s <= t) {
      const float* q_row = tiles.q + r * ld;
      const float* dy_row = tiles.dy + r * ld;
      const float* k_row = tiles.k + c * ld;
      const float* v_row = tiles.v + c * ld;
      float score = 0.0f, dprob = 0.0f;
      for (int d = 0; d < head_dim; ++d) {
        score += (scale * q_row[d]) * k_row[d];
        dprob += dy_row[d] * v_row[d];
      }
      prob = fast_exp(score - tiles.lse[r]);
      dscore = scale * prob * (dprob - tiles.delta[r]);
    }
    tiles.probs[e] = prob;
    tiles.dscores[e] = dscore;
  }
}

// dV_s += sum_t P_ts dY_t and dK_s += sum_t dS_ts Q_t for the keys s of one key tile, over the
// query rows t >= j0 (rows above see none of the tile). A warp owns 4 keys, a lane their
// columns d = lane + 32 x.
__global__ void flash_attention_backward_dkv_kernel(float* dk, float* dv, const float* dy,
                                                    const float* lse, const float* delta,
                                                    const float* q, const float* k, const float* v,
                                                    AttentionStrides strides, int seq_len,
                                                    int n_head, int head_dim, float scale) {
  extern __shared__ float shared[];
  const BackwardTiles tiles = backward_tiles(shared, head_dim);
  const int ld = head_dim + 1;
  const int bh = blockIdx.x, j0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const HeadOffsets at = head_offsets(strides, bh, seq_len, n_head, head_dim);
  load_tile(tiles.k, k + at.k, strides.k, j0, seq_len, head_dim, 1.0f);
  load_tile(tiles.v, v + at.v, strides.v, j0, seq_len, head_dim, 1.0f);
  float dk_acc[kRowsPerWarp][kDimsPerLane] = {}, dv_acc[kRowsPerWarp][kDimsPerLane] = {};
  for (int i0 = j0; i0 < seq_len; i0 += kTile) {
    __syncthreads();  // the previous query tiles are read
    load_query_tiles(tiles, q, dy, lse, delta, strides, at, bh, i0, seq_len, head_dim);
    __syncthreads();
    tile_probs_and_dscores(tiles, i0, j0, seq_len, head_dim, scale);
    __syncthreads();
    const int rows = min(kTile, seq_len - i0);
    for (int r = 0; r < rows; ++r) {
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int c = warp * kRowsPerWarp + i;
        const float prob = tiles.probs[r * kTile + c], dscore = tiles.dscores[r * kTile + c];
#pragma unroll
        for (int x = 0; x < kDimsPerLane; ++x) {
          const int d = lane + 32 * x;
          if (d >= head_dim) continue;
          dv_acc[i][x] += prob * tiles.dy[r * ld + d];
          dk_acc[i][x] += dscore * tiles.q[r * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int s = j0 + warp * kRowsPerWarp + i;
    if (s >= seq_len) continue;
    float* dk_row = dk + at.k + static_cast<int64_t>(s) * strides.k;
    float* dv_row = dv + at.v + static_cast<int64_t>(s) * strides.v;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) {
      const int d = lane + 32 * x;
      if (d >= head_dim) continue;
      dk_row[d] += dk_acc[i][x];
      dv_row[d] += dv_acc[i][x];
    }
  }
}

// dQ_t += sum_s dS_ts K_s for the rows t of one query tile, over the key tiles s <= t. A warp
// owns 4 rows, a lane their columns d = lane + 32 x.
__global__ void flash_attention_backward_dq_kernel(float* dq, const float* dy, const float* lse,
                                                   const float* delta, const float* q,
                                                   const float* k, const float* v,
                                                   AttentionStrides strides, int seq_len,
                                                   int n_head, int head_dim, float scale) {
  extern __shared__ float shared[];
  const BackwardTiles tiles = backward_tiles(shared, head_dim);
  const int ld = head_dim + 1;
  const int bh = blockIdx.x, i0 = blockIdx.y * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const HeadOffsets at = head_offsets(strides, bh, seq_len, n_head, head_dim);
  load_query_tiles(tiles, q, dy, lse, delta, strides, at, bh, i0, seq_len, head_dim);
  float dq_acc[kRowsPerWarp][kDimsPerLane] = {};
  const int last_row = min(i0 + kTile, seq_len) - 1;
  for (int j0 = 0; j0 <= last_row; j0 += kTile) {
    __syncthreads();  // the previous key tiles are read
    load_tile(tiles.k, k + at.k, strides.k, j0, seq_len, head_dim, 1.0f);
    load_tile(tiles.v, v + at.v, strides.v, j0, seq_len, head_dim, 1.0f);
    __syncthreads();
    tile_probs_and_dscores(tiles, i0, j0, seq_len, head_dim, scale);
    __syncthreads();
    const int keys = min(kTile, seq_len - j0);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp * kRowsPerWarp + i;
      for (int c = 0; c < keys; ++c) {
        const float dscore = tiles.dscores[r * kTile + c];
#pragma unroll
        for (int x = 0; x < kDimsPerLane; ++x) {
          const int d = lane + 32 * x;
          if (d < head_dim) dq_acc[i][x] += dscore * tiles.k[c * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int t = i0 + warp * kRowsPerWarp + i;
    if (t >= seq_len) continue;
    float* dq_row = dq + at.q + static_cast<int64_t>(t) * strides.q;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) {
      const int d = lane + 32 * x;
      if (d < head_dim) dq_row[d] += dq_acc[i][x];
    }
  }
}

// Grants `kernel` `bytes` of dynamic shared memory when that is above the default; `granted`
// remembers the most granted so far (one per kernel; the training thread only).
template <typename Kernel>
void grant_shared_bytes(Kernel kernel, size_t bytes, size_t& granted) {
  if (bytes <= kDefaultSharedBytes || bytes <= granted) return;
  FT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
  granted = bytes;
}

int checked_head_dim(int channels, int n_head) {
  const int head_dim = channels / n_head;
  FT_CHECK(head_dim <= kMaxHeadDim, "FlashAttentionOp: head_dim ", head_dim,
           " has no CUDA kernel (at most ", kMaxHeadDim, ")");
  return head_dim;
}

dim3 tile_grid(int batch, int seq_len, int n_head) {
  return dim3(static_cast<unsigned>(batch * n_head),
              static_cast<unsigned>((seq_len + kTile - 1) / kTile));
}

}  // namespace

void flash_attention_forward_cuda(float* y, float* lse, const float* q, const float* k,
                                  const float* v, const AttentionStrides& strides, int batch,
                                  int seq_len, int channels, int n_head, CudaStream stream) {
  const int head_dim = checked_head_dim(channels, n_head);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const size_t shared_bytes = sizeof(float) * 3 * kTile * (head_dim + 1);
  static size_t granted = 0;
  grant_shared_bytes(flash_attention_forward_kernel, shared_bytes, granted);
  flash_attention_forward_kernel<<<tile_grid(batch, seq_len, n_head), kThreads, shared_bytes,
                                   stream>>>(y, lse, q, k, v, strides, seq_len, n_head, head_dim,
                                             scale);
  FT_CUDA_CHECK_LAUNCH();
}

void flash_attention_backward_cuda(float* dq, float* dk, float* dv, float* delta, const float* dy,
                                   const float* y, const float* lse, const float* q, const float* k,
                                   const float* v, const AttentionStrides& strides, int batch,
                                   int seq_len, int channels, int n_head, CudaStream stream) {
  const int head_dim = checked_head_dim(channels, n_head);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t head_rows = static_cast<int64_t>(batch) * n_head * seq_len;
  attention_delta_kernel<<<static_cast<unsigned>((head_rows + kWarps - 1) / kWarps), kThreads, 0,
                           stream>>>(delta, dy, y, strides.y, head_rows, seq_len, n_head, head_dim);
  FT_CUDA_CHECK_LAUNCH();
  const size_t shared_bytes =
      sizeof(float) * (4 * kTile * (head_dim + 1) + 2 * kTile * kTile + 2 * kTile);
  static size_t dkv_granted = 0, dq_granted = 0;
  grant_shared_bytes(flash_attention_backward_dkv_kernel, shared_bytes, dkv_granted);
  grant_shared_bytes(flash_attention_backward_dq_kernel, shared_bytes, dq_granted);
  const dim3 grid = tile_grid(batch, seq_len, n_head);
  flash_attention_backward_dkv_kernel<<<grid, kThreads, shared_bytes, stream>>>(
      dk, dv, dy, lse, delta, q, k, v, strides, seq_len, n_head, head_dim, scale);
  FT_CUDA_CHECK_LAUNCH();
  flash_attention_backward_dq_kernel<<<grid, kThreads, shared_bytes, stream>>>(
      dq, dy, lse, delta, q, k, v, strides, seq_len, n_head, head_dim, scale);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
