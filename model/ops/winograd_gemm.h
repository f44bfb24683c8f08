// The GEMM inside the Winograd kernels (model/ops/winograd_kernels.h): one product per transform
// point, small (rows = tiles of a block or output channels, columns and depth = channels), with a
// strided A operand, so a register-tiled loop beats calling a library per point.
// Two register tiles, one per vector width, both 12 accumulators:
//   AVX2 (8 lanes):     6 rows x 16 columns (two vectors a row)
//   AVX-512 (16 lanes): 6 rows x 32 columns where the columns allow, else 12 rows x 16
// Internal to the Winograd kernels, with internal linkage (see winograd_tiles.h).
#pragma once
#include <cstdint>

#include "model/ops/winograd.h"
#include "model/ops/winograd_tiles.h"

namespace ft::winograd {
namespace {

constexpr int kCols = 16;  // columns (channels) come in multiples of this
// A block's tile count is a multiple of every register tile's rows at width L.
template <int L>
constexpr int kBlockRows = L == 8 ? 6 : 12;

// c[r][0..kVecs * L) (=, or += when kAccumulate) sum_k a[r * a_row + k * a_k] * b[k * ldb + ...],
// for r < Rows. The 12 accumulators are named variables, not an array: GCC kept an array of
// vectors in a stack copy that it zeroed and reloaded around every call (1.5% of a resnet20
// step). Rows, kVecs and kAccumulate are template arguments, so unused rows vanish and the
// epilogue has no branch; noinline keeps each instantiation a function of its own.
template <int L, int Rows, int kVecs, bool kAccumulate>
__attribute__((noinline)) void multiply_tile(float* c, int64_t ldc, const float* a, int64_t a_row,
                                             int64_t a_k, const float* b, int64_t ldb, int depth) {
  static_assert(Rows * kVecs <= 12 && (kVecs == 1 || kVecs == 2), "12 accumulators at most");
  using V = Vec<L>;
  [[maybe_unused]] V low0{}, low1{}, low2{}, low3{}, low4{}, low5{};
  [[maybe_unused]] V low6{}, low7{}, low8{}, low9{}, low10{}, low11{};
  // high6..high11 are never used (two vectors a row means 6 rows at most), but the macros below
  // name them in discarded branches, which still need the names to exist.
  [[maybe_unused]] V high0{}, high1{}, high2{}, high3{}, high4{}, high5{};
  [[maybe_unused]] V high6{}, high7{}, high8{}, high9{}, high10{}, high11{};
  for (int k = 0; k < depth; ++k) {
    const V b_low = load<L>(b + k * ldb);
    [[maybe_unused]] V b_high{};
    if constexpr (kVecs == 2) b_high = load<L>(b + k * ldb + L);
    const float* a_column = a + k * a_k;
#define FT_ROW_FMA(r)                                      \
  if constexpr (Rows > r) {                                \
    const float a_value = a_column[r * a_row];             \
    low##r += a_value * b_low;                             \
    if constexpr (kVecs == 2) high##r += a_value * b_high; \
  }
    FT_ROW_FMA(0);
    FT_ROW_FMA(1);
    FT_ROW_FMA(2);
    FT_ROW_FMA(3);
    FT_ROW_FMA(4);
    FT_ROW_FMA(5);
    FT_ROW_FMA(6);
    FT_ROW_FMA(7);
    FT_ROW_FMA(8);
    FT_ROW_FMA(9);
    FT_ROW_FMA(10);
    FT_ROW_FMA(11);
#undef FT_ROW_FMA
  }
#define FT_ROW_STORE(r)                                                      \
  if constexpr (Rows > r) {                                                  \
    float* row = c + r * ldc;                                                \
    store<L>(row, kAccumulate ? load<L>(row) + low##r : low##r);             \
    if constexpr (kVecs == 2)                                                \
      store<L>(row + L, kAccumulate ? load<L>(row + L) + high##r : high##r); \
  }
  FT_ROW_STORE(0);
  FT_ROW_STORE(1);
  FT_ROW_STORE(2);
  FT_ROW_STORE(3);
  FT_ROW_STORE(4);
  FT_ROW_STORE(5);
  FT_ROW_STORE(6);
  FT_ROW_STORE(7);
  FT_ROW_STORE(8);
  FT_ROW_STORE(9);
  FT_ROW_STORE(10);
  FT_ROW_STORE(11);
#undef FT_ROW_STORE
}

template <int L, int Rows, int kVecs>
inline void multiply_rows(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k,
                          const float* b, int64_t ldb, int depth, WinogradWrite write) {
  if (write == WinogradWrite::kAccumulate)
    multiply_tile<L, Rows, kVecs, true>(c, ldc, a, a_row, a_k, b, ldb, depth);
  else
    multiply_tile<L, Rows, kVecs, false>(c, ldc, a, a_row, a_k, b, ldb, depth);
}

// The columns [col, col + kVecs * L) over all rows, kMaxRows rows at a time.
template <int L, int kVecs>
inline void multiply_panel(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k,
                           const float* b, int64_t ldb, int rows, int col, int depth,
                           WinogradWrite write) {
  constexpr int kMaxRows = 12 / kVecs;
  for (int row = 0; row < rows; row += kMaxRows) {
    float* c_tile = c + row * ldc + col;
    const float* a_tile = a + row * a_row;
    const float* b_panel = b + col;
    switch (rows - row < kMaxRows ? rows - row : kMaxRows) {
#define FT_MULTIPLY_CASE(n)                                                                    \
  case n:                                                                                      \
    if constexpr (n <= kMaxRows)                                                               \
      multiply_rows<L, n, kVecs>(c_tile, ldc, a_tile, a_row, a_k, b_panel, ldb, depth, write); \
    break;
      FT_MULTIPLY_CASE(1)
      FT_MULTIPLY_CASE(2)
      FT_MULTIPLY_CASE(3)
      FT_MULTIPLY_CASE(4)
      FT_MULTIPLY_CASE(5)
      FT_MULTIPLY_CASE(6)
      FT_MULTIPLY_CASE(7)
      FT_MULTIPLY_CASE(8)
      FT_MULTIPLY_CASE(9)
      FT_MULTIPLY_CASE(10)
      FT_MULTIPLY_CASE(11)
      FT_MULTIPLY_CASE(12)
#undef FT_MULTIPLY_CASE
    }
  }
}

// c[rows x cols] (=, or +=) a * b with a(r, k) = a[r * a_row + k * a_k], b row-major (ldb).
// REQUIRES: cols a multiple of 16.
template <int L>
inline void multiply(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k,
                     const float* b, int64_t ldb, int rows, int cols, int depth,
                     WinogradWrite write) {
  constexpr int kPairWidth = 2 * L;  // columns of a two-vector panel
  int col = 0;
  if constexpr (L == 8) {  // 16 columns are one two-vector panel
    for (; col < cols; col += kPairWidth)
      multiply_panel<L, 2>(c, ldc, a, a_row, a_k, b, ldb, rows, col, depth, write);
  } else {
    for (; col + kPairWidth <= cols; col += kPairWidth)
      multiply_panel<L, 2>(c, ldc, a, a_row, a_k, b, ldb, rows, col, depth, write);
    for (; col < cols; col += L)
      multiply_panel<L, 1>(c, ldc, a, a_row, a_k, b, ldb, rows, col, depth, write);
  }
}

}  // namespace
}  // namespace ft::winograd
