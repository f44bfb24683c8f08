// The GEMM inside the Winograd kernels (model/ops/winograd.cpp): one product per transform point,
// small (rows = tiles of a block or output channels, columns and depth = channels), with a
// strided A operand, so a register-tiled loop beats calling a library per point.
// Internal to model/ops/winograd.cpp; not a public header.
#pragma once
#include <algorithm>
#include <cstdint>

#include "model/ops/winograd.h"
#include "model/ops/winograd_tiles.h"

namespace ft::winograd {

constexpr int kRows = 6;  // register tile: 6 rows x 16 columns, 12 AVX accumulators
constexpr int kCols = 16;

// c[r][0..16) (=, or += when kAccumulate) sum_k a[r * a_row + k * a_k] * b[k * ldb + 0..16), for
// r < Rows. The 12 accumulators are named variables, not an array: GCC kept an array of vectors
// in a stack copy that it zeroed and reloaded around every call (1.5% of a resnet20 step). Rows
// and kAccumulate are template arguments, so unused rows vanish and the epilogue has no branch;
// noinline keeps each instantiation a function of its own.
template <int Rows, bool kAccumulate>
__attribute__((noinline)) inline void multiply_tile(float* c, int64_t ldc, const float* a,
                                                    int64_t a_row, int64_t a_k, const float* b,
                                                    int64_t ldb, int depth) {
  Vec8 low0{}, high0{}, low1{}, high1{}, low2{}, high2{};
  Vec8 low3{}, high3{}, low4{}, high4{}, low5{}, high5{};
  for (int k = 0; k < depth; ++k) {
    const Vec8 b_low = load8(b + k * ldb), b_high = load8(b + k * ldb + 8);
    const float* a_column = a + k * a_k;
#define FT_ROW_FMA(r)                          \
  if constexpr (Rows > r) {                    \
    const float a_value = a_column[r * a_row]; \
    low##r += a_value * b_low;                 \
    high##r += a_value * b_high;               \
  }
    FT_ROW_FMA(0) FT_ROW_FMA(1) FT_ROW_FMA(2) FT_ROW_FMA(3) FT_ROW_FMA(4) FT_ROW_FMA(5)
#undef FT_ROW_FMA
  }
#define FT_ROW_STORE(r)                                                \
  if constexpr (Rows > r) {                                            \
    float* row = c + r * ldc;                                          \
    store8(row, kAccumulate ? load8(row) + low##r : low##r);           \
    store8(row + 8, kAccumulate ? load8(row + 8) + high##r : high##r); \
  }
  FT_ROW_STORE(0) FT_ROW_STORE(1) FT_ROW_STORE(2) FT_ROW_STORE(3) FT_ROW_STORE(4) FT_ROW_STORE(5)
#undef FT_ROW_STORE
}

template <int Rows>
inline void multiply_rows(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k,
                          const float* b, int64_t ldb, int depth, WinogradWrite write) {
  if (write == WinogradWrite::kAccumulate)
    multiply_tile<Rows, true>(c, ldc, a, a_row, a_k, b, ldb, depth);
  else
    multiply_tile<Rows, false>(c, ldc, a, a_row, a_k, b, ldb, depth);
}

// c[rows x cols] (=, or +=) a * b with a(r, k) = a[r * a_row + k * a_k], b row-major (ldb).
// REQUIRES: cols a multiple of 16.
inline void multiply(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k,
                     const float* b, int64_t ldb, int rows, int cols, int depth,
                     WinogradWrite write) {
  for (int col = 0; col < cols; col += kCols)
    for (int row = 0; row < rows; row += kRows) {
      float* c_tile = c + row * ldc + col;
      const float* a_tile = a + row * a_row;
      const float* b_panel = b + col;
      switch (std::min(kRows, rows - row)) {
#define FT_MULTIPLY_CASE(n)                                                        \
  case n:                                                                          \
    multiply_rows<n>(c_tile, ldc, a_tile, a_row, a_k, b_panel, ldb, depth, write); \
    break;
        FT_MULTIPLY_CASE(1)
        FT_MULTIPLY_CASE(2)
        FT_MULTIPLY_CASE(3)
        FT_MULTIPLY_CASE(4)
        FT_MULTIPLY_CASE(5)
        FT_MULTIPLY_CASE(6)
#undef FT_MULTIPLY_CASE
      }
    }
}

}  // namespace ft::winograd
