// Bias add plus activation over a row-major [rows, cols] device matrix, in place:
// x[r, c] = act(x[r, c] + bias[c]). It is the unfused twin of cuBLASLt's BIAS/RELU/GELU
// epilogues, used when cuBLASLt offers no fused algorithm (e.g. a bias that is not 16-byte
// aligned) and by tests that check the fused epilogue against it.
// Thread safety: the launcher only enqueues work on the given stream; safe from any thread.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ft {

enum class Activation { kNone, kRelu, kGelu };  // kGelu is the tanh approximation

// REQUIRES: x is a device pointer to rows * cols floats; bias is null or holds cols floats.
void bias_activation_forward_cuda(float* x, const float* bias, int64_t rows, int64_t cols,
                                  Activation activation, cudaStream_t stream);

}  // namespace ft
