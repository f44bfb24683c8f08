#include "core/bf16_cast.h"

namespace ft {
namespace {

constexpr int64_t kParallelElements = 1 << 16;  // below this a thread team costs more than it saves

}  // namespace

// Small counts run a plain simd loop: GCC 12 compiles the serial branch of `parallel for simd
// if (...)` unvectorised, which made a 64 Ki-element cast 3x slower than one of the parallel
// branch (and the multi-tensor sweep's per-chunk weight copies slower than a separate sweep).
void cast_to_bf16(bf16_bits* out, const float* in, int64_t count) {
  if (count <= kParallelElements) return store_row_bf16(out, in, count);
#pragma omp parallel for simd
  for (int64_t i = 0; i < count; ++i) out[i] = float_to_bf16(in[i]);
}

void cast_to_float(float* out, const bf16_bits* in, int64_t count) {
  if (count <= kParallelElements) {
#pragma omp simd
    for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]);
    return;
  }
#pragma omp parallel for simd
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]);
}

void cast_rows_to_bf16(bf16_bits* out, int64_t out_stride, const float* in, int64_t in_stride,
                       int64_t rows, int64_t cols) {
  if (out_stride == 0) out_stride = cols;
  if (in_stride == 0) in_stride = cols;
#pragma omp parallel for if (rows * cols > kParallelElements)
  for (int64_t row = 0; row < rows; ++row) {
    bf16_bits* out_row = out + row * out_stride;
    const float* in_row = in + row * in_stride;
#pragma omp simd
    for (int64_t col = 0; col < cols; ++col) out_row[col] = float_to_bf16(in_row[col]);
  }
}

}  // namespace ft
