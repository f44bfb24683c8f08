// LayerNorm's kernels over the last axis, CPU (layernorm.cpp) beside CUDA (layernorm.cu), shared
// by LayerNormOp (model/ops/layernorm.h) and fusion/'s LayerNormCastOp, ResidualLayerNormOp and
// BatchedLayerNormOp:
//   y[r] = (x[r] - mean_r) * rstd_r * weight + bias, eps 1e-5 (the row math: layernorm_math.h).
// CUDA: one warp per row for forward and the input gradient; the weight and bias gradients are a
// deterministic two-stage column reduction (fixed row chunks, summed in order), so a step's bits
// do not change from run to run.
// Thread safety: pure functions over the pointers given; rows run in parallel with OpenMP.
#pragma once
#include <cstdint>

#include "core/device.h"

namespace ft {

// Strides are floats between rows (0 = channels): views such as one head's columns of q.
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t rows, int64_t channels, int64_t y_stride = 0,
                       int64_t x_stride = 0);
// dx += ...; dweight += ...; dbias += ... (see layernorm_math.h for the math).
// dx shares x's stride, dy y's.
void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                        const float* weight, const float* mean, const float* rstd, int64_t rows,
                        int64_t channels, int64_t dy_stride = 0, int64_t x_stride = 0);

// CUDA (layernorm.cu; CUDA builds only), on device pointers, enqueued on `stream`: the tensors of
// one LayerNorm in a launch of `count` of them, all [rows, channels] (BatchedLayerNormOp launches
// many, LayerNormOp one). Forward reads x, weight, bias and writes y; backward reads dy, x, weight
// and adds (+=) into dx, dweight and dbias. Pointers a launcher does not use may be null.
struct LayerNormCudaTensors {
  float* y = nullptr;
  float* dx = nullptr;
  float* dweight = nullptr;
  float* dbias = nullptr;
  const float* x = nullptr;
  const float* dy = nullptr;
  const float* weight = nullptr;
  const float* bias = nullptr;
  int64_t y_stride = 0, x_stride = 0;  // floats between rows (0 = channels); dy as y, dx as x
};

// Rows per chunk of the parameter-gradient reduction: each chunk's column sums land in scratch,
// then every column adds its chunks in order.
constexpr int64_t kLayerNormParamChunkRows = 256;
// Scratch floats layernorm_backward_params_cuda needs for `count` LayerNorms.
inline int64_t layernorm_params_scratch_floats(int count, int64_t rows, int64_t channels) {
  const int64_t chunks = (rows + kLayerNormParamChunkRows - 1) / kLayerNormParamChunkRows;
  return static_cast<int64_t>(count) * chunks * 2 * channels;
}

// mean, rstd: [count * rows], LayerNorm n's rows at n * rows.
void layernorm_batch_forward_cuda(float* mean, float* rstd, const LayerNormCudaTensors* norms,
                                  int count, int64_t rows, int64_t channels, CudaStream stream);
// dx += the input gradient of each LayerNorm.
void layernorm_batch_backward_input_cuda(const LayerNormCudaTensors* norms, const float* mean,
                                         const float* rstd, int count, int64_t rows,
                                         int64_t channels, CudaStream stream);
// dweight += sum over rows of dy * xhat, dbias += sum over rows of dy, LayerNorm by LayerNorm from
// the last to the first, so LayerNorms may share parameters (BatchedLayerNormOp's heads).
// scratch: layernorm_params_scratch_floats(count, rows, channels) floats.
void layernorm_batch_backward_params_cuda(float* scratch, const LayerNormCudaTensors* norms,
                                          const float* mean, const float* rstd, int count,
                                          int64_t rows, int64_t channels, CudaStream stream);
// layernorm_forward / layernorm_backward on the device (count 1).
void layernorm_forward_cuda(float* y, float* mean, float* rstd, const float* x, const float* weight,
                            const float* bias, int64_t rows, int64_t channels, int64_t y_stride,
                            int64_t x_stride, CudaStream stream);
void layernorm_backward_cuda(float* dx, float* dweight, float* dbias, float* scratch,
                             const float* dy, const float* x, const float* weight,
                             const float* mean, const float* rstd, int64_t rows, int64_t channels,
                             int64_t dy_stride, int64_t x_stride, CudaStream stream);

}  // namespace ft
