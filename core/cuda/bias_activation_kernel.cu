// In-place bias + activation kernel (the unfused GEMM epilogue). One grid-stride loop over all
// elements; the column of element i is i % cols because the matrix is row-major.
#include <algorithm>

#include "core/cuda/bias_activation_kernel.h"
#include "core/cuda/cuda_check.h"
#include "core/math/gelu.h"

namespace ft {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 132 * 16;  // several waves on an H200's 132 SMs

template <Activation kActivation>
__global__ void bias_activation_kernel(float* x, const float* bias, int64_t total, int64_t cols) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    float value = x[i];
    if (bias != nullptr) value += bias[i % cols];
    if (kActivation == Activation::kRelu) value = fmaxf(value, 0.0f);
    if (kActivation == Activation::kGelu) value = gelu_tanh(value);
    x[i] = value;
  }
}

}  // namespace

void bias_activation_forward_cuda(float* x, const float* bias, int64_t rows, int64_t cols,
                                  Activation activation, cudaStream_t stream) {
  FT_CHECK(rows >= 0 && cols >= 0, "bias_activation_forward_cuda: rows = ", rows,
           ", cols = ", cols);
  const int64_t total = rows * cols;
  if (total == 0 || (bias == nullptr && activation == Activation::kNone)) return;
  const auto blocks = static_cast<unsigned int>(
      std::min((total + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxBlocks));
  switch (activation) {
    case Activation::kNone:
      bias_activation_kernel<Activation::kNone>
          <<<blocks, kThreadsPerBlock, 0, stream>>>(x, bias, total, cols);
      break;
    case Activation::kRelu:
      bias_activation_kernel<Activation::kRelu>
          <<<blocks, kThreadsPerBlock, 0, stream>>>(x, bias, total, cols);
      break;
    case Activation::kGelu:
      bias_activation_kernel<Activation::kGelu>
          <<<blocks, kThreadsPerBlock, 0, stream>>>(x, bias, total, cols);
      break;
  }
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft
