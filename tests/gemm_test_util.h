// Random inputs for GEMM tests, shared by the CPU GEMM tests (tests/gemm_test.cpp) and the
// cuBLASLt ones (tests/cuda_kernels_test.cpp): every buffer sized from the resolved strides, so
// padding between rows and batches is present (and must stay untouched); and bf16 operands for
// the bf16 GEMM tests (tests/bf16_kernels_test.cpp, cuda_bf16_test.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "core/bf16_cast.h"
#include "core/gemm.h"
#include "core/math/bf16_math.h"

namespace ft {
namespace gemm_test {

inline std::vector<float> uniform(size_t count, float low, float high, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

struct GemmBuffers {
  std::vector<float> a, b, c, bias, aux, bias_grad;
};

inline GemmBuffers make_gemm_buffers(const GemmArgs& args, uint32_t seed) {
  const GemmArgs r = resolve_gemm_strides(args);
  const auto extent = [&](int64_t rows, int64_t ld, int64_t stride) {
    return static_cast<size_t>((r.batch - 1) * stride + rows * ld);
  };
  GemmBuffers buffers;
  buffers.a = uniform(extent(r.transpose_a ? r.k : r.m, r.lda, r.batch_stride_a), -1, 1, seed);
  buffers.b = uniform(extent(r.transpose_b ? r.n : r.k, r.ldb, r.batch_stride_b), -1, 1, seed + 1);
  buffers.c = uniform(extent(r.m, r.ldc, r.batch_stride_c), -1, 1, seed + 2);
  buffers.bias = uniform(static_cast<size_t>(r.n), -1, 1, seed + 3);
  buffers.aux = uniform(static_cast<size_t>(r.m * r.ld_aux), -3, 3, seed + 4);
  buffers.bias_grad.assign(static_cast<size_t>(std::max(r.m, r.n)), 7.0f);
  return buffers;
}

// `values` rounded to bf16 (nearest, ties to even), as bf16 bits.
inline std::vector<bf16_bits> to_bf16(const std::vector<float>& values) {
  std::vector<bf16_bits> bits(values.size());
  cast_to_bf16(bits.data(), values.data(), static_cast<int64_t>(values.size()));
  return bits;
}

// `values` rounded to bf16 and widened back: the fp32 values a bf16 operand holds.
inline std::vector<float> rounded(const std::vector<float>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = round_to_bf16(values[i]);
  return out;
}

}  // namespace gemm_test
}  // namespace ft
