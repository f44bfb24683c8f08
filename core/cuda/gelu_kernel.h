// GELU (tanh approximation, GPT-2) on CUDA device buffers: forward and backward launchers.
// The math is ft::gelu_tanh / ft::gelu_tanh_grad from core/math/gelu.h, shared with the CPU path.
// Thread safety: launchers only enqueue work on the given stream; safe from any thread.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ft {

// out[i] = gelu(in[i]). REQUIRES: out and in are device pointers to n floats; they may alias.
void gelu_forward_cuda(float* out, const float* in, int64_t n, cudaStream_t stream);

// din[i] += dout[i] * gelu'(in[i]). Accumulates, so a tensor feeding several ops sums its grads.
// REQUIRES: device pointers to n floats; din does not alias in or dout.
void gelu_backward_cuda(float* din, const float* in, const float* dout, int64_t n,
                        cudaStream_t stream);

}  // namespace ft
