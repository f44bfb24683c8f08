// LayerNorm on CUDA: the kernels, then their launchers. Each LayerNorm of a launch is one entry
// of a table passed by value (BatchedLayerNormOp's heads; LayerNormOp is a table of one); the row
// math is kernels/layernorm_math.h's, which the CPU loops also call.
//   forward, input gradient: one warp per row, 8 rows per block, blockIdx.y picks the LayerNorm.
//   weight/bias gradients: stage 1 sums each 256-row chunk of every column into scratch (a block
//   covers 32 columns x 8 row lanes, reads coalesced along the columns); stage 2 adds each
//   column's chunks in order. No atomics, so the result is the same bits on every run.
#include <algorithm>

#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/launch.h"
#include "kernels/layernorm.h"
#include "kernels/layernorm_math.h"

namespace ft {
namespace {

// Kernel parameters are limited to 4 KiB: 32 entries of 80 bytes fit, more take several launches.
constexpr int kNormsPerLaunch = 32;
struct NormTable {
  LayerNormCudaTensors norm[kNormsPerLaunch];
};

constexpr int kRowsPerBlock = kCudaThreadsPerBlock / kLayerNormWarp;
constexpr int kParamColumns = 32;  // columns per stage-1 block, one per lane of threadIdx.x
constexpr int kParamRowLanes = 8;  // threadIdx.y: row lanes per stage-1 block

__device__ inline int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLayerNormWarp;
}

// The row index is uniform within a warp, so a warp past the last row leaves as a whole and the
// full-mask shuffles of the survivors see all 32 lanes.
__global__ void layernorm_forward_kernel(float* mean, float* rstd,
                                         const __grid_constant__ NormTable table, int64_t rows,
                                         int64_t channels) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = threadIdx.x % kLayerNormWarp;
  const LayerNormCudaTensors& t = table.norm[blockIdx.y];
  float row_mean, row_rstd;
  layernorm_warp_row_forward(t.y + row * t.y_stride, &row_mean, &row_rstd, t.x + row * t.x_stride,
                             t.weight, t.bias, channels, kLayerNormEps, lane);
  if (lane == 0) {
    mean[blockIdx.y * rows + row] = row_mean;
    rstd[blockIdx.y * rows + row] = row_rstd;
  }
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight (layernorm_math.h).
__global__ void layernorm_backward_input_kernel(const __grid_constant__ NormTable table,
                                                const float* mean, const float* rstd, int64_t rows,
                                                int64_t channels) {
  const int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = threadIdx.x % kLayerNormWarp;
  const LayerNormCudaTensors& t = table.norm[blockIdx.y];
  const float row_mean = mean[blockIdx.y * rows + row], row_rstd = rstd[blockIdx.y * rows + row];
  const float* dy = t.dy + row * t.y_stride;
  const float* x = t.x + row * t.x_stride;
  float* dx = t.dx + row * t.x_stride;
  float g_mean, g_xhat_mean;
  layernorm_warp_row_backward_means(&g_mean, &g_xhat_mean, dy, x, t.weight, row_mean, row_rstd,
                                    channels, lane);
  for (int64_t i = lane; i < channels; i += kLayerNormWarp)
    dx[i] +=
        layernorm_input_grad(dy[i], t.weight[i], x[i], row_mean, row_rstd, g_mean, g_xhat_mean);
}

// Stage 1: scratch[((n * chunks + chunk) * 2 + {0: dweight, 1: dbias}) * channels + c] = the sum
// over the chunk's rows of dy * xhat and of dy. Grid (column blocks, chunks, LayerNorms).
__global__ void layernorm_param_partials_kernel(float* scratch,
                                                const __grid_constant__ NormTable table,
                                                const float* mean, const float* rstd, int64_t rows,
                                                int64_t channels) {
  __shared__ float dweight_lanes[kParamRowLanes][kParamColumns];
  __shared__ float dbias_lanes[kParamRowLanes][kParamColumns];
  const int n = blockIdx.z;
  const LayerNormCudaTensors& t = table.norm[n];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kParamColumns + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t chunk_end = (chunk + 1) * kLayerNormParamChunkRows;
  const int64_t end = chunk_end < rows ? chunk_end : rows;
  float dweight = 0.0f, dbias = 0.0f;
  if (c < channels) {
    for (int64_t row = chunk * kLayerNormParamChunkRows + threadIdx.y; row < end;
         row += kParamRowLanes) {
      const float dy = t.dy[row * t.y_stride + c];
      dweight += layernorm_times_xhat(dy, t.x[row * t.x_stride + c], mean[n * rows + row],
                                      rstd[n * rows + row]);
      dbias += dy;
    }
  }
  dweight_lanes[threadIdx.y][threadIdx.x] = dweight;
  dbias_lanes[threadIdx.y][threadIdx.x] = dbias;
  __syncthreads();
  if (threadIdx.y != 0 || c >= channels) return;
  for (int lane = 1; lane < kParamRowLanes; ++lane) {
    dweight += dweight_lanes[lane][threadIdx.x];
    dbias += dbias_lanes[lane][threadIdx.x];
  }
  float* partial = scratch + (static_cast<int64_t>(n) * gridDim.y + chunk) * 2 * channels;
  partial[c] = dweight;
  partial[channels + c] = dbias;
}

// Stage 2: one thread per column adds its chunk sums in order, then, LayerNorm by LayerNorm from
// the last, into dweight and dbias. A parameter shared by several LayerNorms is thereby updated
// by one thread at a time.
__global__ void layernorm_param_sum_kernel(const __grid_constant__ NormTable table,
                                           const float* scratch, int count, int64_t chunks,
                                           int64_t channels) {
  FT_GRID_STRIDE_LOOP(c, channels) {
    for (int n = count - 1; n >= 0; --n) {
      float dweight = 0.0f, dbias = 0.0f;
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const float* partial = scratch + (static_cast<int64_t>(n) * chunks + chunk) * 2 * channels;
        dweight += partial[c];
        dbias += partial[channels + c];
      }
      table.norm[n].dweight[c] += dweight;
      table.norm[n].dbias[c] += dbias;
    }
  }
}

// Copies norms[first, first + count) into a kernel table, with stride 0 spelled out.
NormTable make_table(const LayerNormCudaTensors* norms, int first, int count, int64_t channels) {
  NormTable table{};
  for (int n = 0; n < count; ++n) {
    table.norm[n] = norms[first + n];
    if (table.norm[n].y_stride == 0) table.norm[n].y_stride = channels;
    if (table.norm[n].x_stride == 0) table.norm[n].x_stride = channels;
  }
  return table;
}

unsigned int row_blocks(int64_t rows) {
  return static_cast<unsigned int>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

void check_shape(int count, int64_t rows, int64_t channels) {
  FT_CHECK(count > 0 && rows > 0 && channels > 0,
           "layernorm (cuda): non-positive shape count=", count, " rows=", rows,
           " channels=", channels);
  FT_CHECK(rows <= static_cast<int64_t>(0x7fffffff) * kRowsPerBlock &&
               rows <= 65535 * kLayerNormParamChunkRows,
           "layernorm (cuda): ", rows, " rows exceed the launch grid");
}

}  // namespace

void layernorm_batch_forward_cuda(float* mean, float* rstd, const LayerNormCudaTensors* norms,
                                  int count, int64_t rows, int64_t channels, CudaStream stream) {
  check_shape(count, rows, channels);
  for (int first = 0; first < count; first += kNormsPerLaunch) {
    const int launch_count = std::min(kNormsPerLaunch, count - first);
    const dim3 grid(row_blocks(rows), static_cast<unsigned int>(launch_count));
    layernorm_forward_kernel<<<grid, kCudaThreadsPerBlock, 0, stream>>>(
        mean + first * rows, rstd + first * rows, make_table(norms, first, launch_count, channels),
        rows, channels);
    FT_CUDA_CHECK_LAUNCH();
  }
}

void layernorm_batch_backward_input_cuda(const LayerNormCudaTensors* norms, const float* mean,
                                         const float* rstd, int count, int64_t rows,
                                         int64_t channels, CudaStream stream) {
  check_shape(count, rows, channels);
  for (int first = 0; first < count; first += kNormsPerLaunch) {
    const int launch_count = std::min(kNormsPerLaunch, count - first);
    const dim3 grid(row_blocks(rows), static_cast<unsigned int>(launch_count));
    layernorm_backward_input_kernel<<<grid, kCudaThreadsPerBlock, 0, stream>>>(
        make_table(norms, first, launch_count, channels), mean + first * rows, rstd + first * rows,
        rows, channels);
    FT_CUDA_CHECK_LAUNCH();
  }
}

void layernorm_batch_backward_params_cuda(float* scratch, const LayerNormCudaTensors* norms,
                                          const float* mean, const float* rstd, int count,
                                          int64_t rows, int64_t channels, CudaStream stream) {
  check_shape(count, rows, channels);
  const int64_t chunks = (rows + kLayerNormParamChunkRows - 1) / kLayerNormParamChunkRows;
  // Launch groups run from the last LayerNorms to the first, as stage 2 does within a group.
  const int groups = (count + kNormsPerLaunch - 1) / kNormsPerLaunch;
  for (int group = groups - 1; group >= 0; --group) {
    const int first = group * kNormsPerLaunch;
    const int launch_count = std::min(kNormsPerLaunch, count - first);
    const NormTable table = make_table(norms, first, launch_count, channels);
    float* group_scratch = scratch + first * chunks * 2 * channels;
    const dim3 partial_grid(
        static_cast<unsigned int>((channels + kParamColumns - 1) / kParamColumns),
        static_cast<unsigned int>(chunks), static_cast<unsigned int>(launch_count));
    layernorm_param_partials_kernel<<<partial_grid, dim3(kParamColumns, kParamRowLanes), 0,
                                      stream>>>(group_scratch, table, mean + first * rows,
                                                rstd + first * rows, rows, channels);
    FT_CUDA_CHECK_LAUNCH();
    layernorm_param_sum_kernel<<<cuda_grid_stride_blocks(channels), kCudaThreadsPerBlock, 0,
                                 stream>>>(table, group_scratch, launch_count, chunks, channels);
    FT_CUDA_CHECK_LAUNCH();
  }
}

void layernorm_forward_cuda(float* y, float* mean, float* rstd, const float* x, const float* weight,
                            const float* bias, int64_t rows, int64_t channels, int64_t y_stride,
                            int64_t x_stride, CudaStream stream) {
  LayerNormCudaTensors norm;
  norm.y = y;
  norm.x = x;
  norm.weight = weight;
  norm.bias = bias;
  norm.y_stride = y_stride;
  norm.x_stride = x_stride;
  layernorm_batch_forward_cuda(mean, rstd, &norm, 1, rows, channels, stream);
}

void layernorm_backward_cuda(float* dx, float* dweight, float* dbias, float* scratch,
                             const float* dy, const float* x, const float* weight,
                             const float* mean, const float* rstd, int64_t rows, int64_t channels,
                             int64_t dy_stride, int64_t x_stride, CudaStream stream) {
  LayerNormCudaTensors norm;
  norm.dx = dx;
  norm.dweight = dweight;
  norm.dbias = dbias;
  norm.dy = dy;
  norm.x = x;
  norm.weight = weight;
  norm.y_stride = dy_stride;
  norm.x_stride = x_stride;
  layernorm_batch_backward_input_cuda(&norm, mean, rstd, 1, rows, channels, stream);
  layernorm_batch_backward_params_cuda(scratch, &norm, mean, rstd, 1, rows, channels, stream);
}

}  // namespace ft
