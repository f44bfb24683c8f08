// The Winograd kernels (model/ops/winograd.h), templated on the vector width L: 8 lanes (AVX2)
// in model/ops/winograd.cpp, 16 lanes (AVX-512) in model/ops/winograd_avx512.cpp, which compiles
// this header with AVX-512 enabled; winograd.cpp picks one at run time (winograd_isa()). Tiles
// (one per m x m block of outputs, numbered over batch, rows, columns) are processed in blocks
// small enough that a block's transformed input and its GEMM products stay in L2:
//   1. transform each tile's window: v[tile][xi][c]                    (adds and scalings)
//   2. one GEMM per transform point xi: m[.][xi][.] = v[.][xi][.] U[xi]  (the multiplies)
//   3. transform back to the outputs and write (or add) them
// Each tile's points sit together (tile-major), so the transforms read and write contiguous
// memory; the GEMMs take the stride. The transforms vectorise over L channels; the GEMMs use
// the register tiles of winograd_gemm.h, written with GCC vector extensions so the compiler
// emits FMAs for the target.
// Internal, with internal linkage (see winograd_tiles.h), except KernelTable.
#pragma once
#include <omp.h>

#include <cstdint>

#include "model/ops/winograd.h"
#include "model/ops/winograd_gemm.h"
#include "model/ops/winograd_tiles.h"

namespace ft::winograd {

// One vector width's kernels, for winograd.cpp's dispatch.
struct KernelTable {
  using Conv = void (*)(float* y, const float* x, const float* transformed,
                        const WinogradShape& shape, WinogradWrite write,
                        const WinogradEpilogue* epilogue);
  using WeightGrad = void (*)(float* weight_grad, const float* x, const float* dy,
                              const WinogradShape& shape);
  Conv conv_f2 = nullptr, conv_f4 = nullptr;
  WeightGrad weight_grad_f2 = nullptr, weight_grad_f4 = nullptr;
};

// The AVX-512 kernels. Defined only when the build compiled model/ops/winograd_avx512.cpp
// (FT_WINOGRAD_AVX512); REQUIRES: the CPU has AVX-512 F, VL, BW and DQ.
const KernelTable& avx512_kernels();

// What the kernels need from the standard library, defined in winograd.cpp with the build's
// flags. winograd_avx512.cpp must instantiate no standard template itself: such an instance is
// a weak symbol that the linker may pick for the whole program, and compiled with AVX-512 it
// would crash an AVX2 machine at the first std::vector<float>::resize. The ctest
// winograd_avx512.no_weak_symbols (tests/no_weak_symbols.sh) checks its object file with nm.
enum class BufferSlot { kInput, kProduct, kWeightGrad };
constexpr int kBufferSlots = 3;
// This thread's buffer for `slot`, at least `count` floats, reused across calls.
float* thread_buffer(BufferSlot slot, int64_t count);
// At least `channels` zeros that loads of the padding point at, so the inner loops never branch.
const float* zero_channels(int channels);
// `threads` pointers, all null, for conv_weight_grad's per-thread partial sums (the caller's
// thread's; valid until its next call).
float** thread_partials(int threads);

namespace {

// std::min and std::max are templates (see above).
template <typename T>
constexpr T at_most(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
constexpr T at_least(T a, T b) {
  return a < b ? b : a;
}

template <typename V>
struct TileGrid {
  explicit TileGrid(const WinogradShape& shape)
      : rows((shape.height + V::kOut - 1) / V::kOut),
        cols((shape.width + V::kOut - 1) / V::kOut),
        count(static_cast<int64_t>(shape.batch) * rows * cols) {}
  int rows, cols;
  int64_t count;
};

// Where a tile's outputs start: image, row, column. Walks the tiles in order with next(), since
// a division per tile cost more than a third of a 16-channel transform.
template <typename V>
struct TileOrigin {
  TileOrigin(int64_t tile, const TileGrid<V>& grid)
      : image(static_cast<int>(tile / (grid.rows * grid.cols))),
        row(V::kOut * static_cast<int>(tile % (grid.rows * grid.cols) / grid.cols)),
        col(V::kOut * static_cast<int>(tile % grid.cols)),
        last_row(V::kOut * (grid.rows - 1)),
        last_col(V::kOut * (grid.cols - 1)) {}
  void next() {
    if (col < last_col) {
      col += V::kOut;
      return;
    }
    col = 0;
    if (row < last_row) {
      row += V::kOut;
      return;
    }
    row = 0;
    ++image;
  }
  int image, row, col;
  int last_row, last_col;
};

// Tiles per block: points x tiles x (in + out) floats, the block's working set, near 256 KB.
template <typename V, int L>
int block_tiles(int in_channels, int out_channels) {
  int tiles = 65536 / (V::kPoints * (in_channels + out_channels));
  tiles -= tiles % kBlockRows<L>;
  return at_least(kBlockRows<L>, tiles);
}

// v[t][xi][c] = (B^T d B)[xi] for the `count` tiles from `first`, d the tile's window of x,
// starting one row and column before its outputs (zero outside x: the padding).
template <typename V, int L>
void transform_input(float* v, const float* x, const WinogradShape& shape, int channels,
                     const TileGrid<V>& grid, int64_t first, int count) {
  constexpr int W = V::kWindow;
  const float* zeros = zero_channels(channels);
  const int64_t image_size = static_cast<int64_t>(shape.height) * shape.width * channels;
  TileOrigin<V> origin(first, grid);
  for (int t = 0; t < count; ++t, origin.next()) {
    const float* window[W][W];
    for (int r = 0; r < W; ++r) {
      const int row = origin.row - 1 + r;
      const bool row_inside = row >= 0 && row < shape.height;
      for (int q = 0; q < W; ++q) {
        const int col = origin.col - 1 + q;
        window[r][q] = row_inside && col >= 0 && col < shape.width
                           ? x + origin.image * image_size +
                                 (static_cast<int64_t>(row) * shape.width + col) * channels
                           : zeros;
      }
    }
    // The next tile along the row reads kOut new columns; ask for them now, since waiting on
    // them in the loop below cost as much as the transform's arithmetic.
    for (int r = 0; r < W; ++r)
      if (window[r][W - 1] != zeros)
        for (int line = 0; line < V::kOut * channels; line += 16)
          __builtin_prefetch(window[r][W - 1] + channels + line);
    float* out = v + static_cast<int64_t>(t) * V::kPoints * channels;
    for (int c = 0; c < channels; c += L) {
      Vec<L> columns[W][W];  // columns[q] = B^T (column q of d)
      for (int q = 0; q < W; ++q) {
        Vec<L> column[W];
        for (int r = 0; r < W; ++r) column[r] = load<L>(window[r][q] + c);
        V::input(column, columns[q]);
      }
      for (int r = 0; r < W; ++r) {
        Vec<L> row[W], transformed[W];
        for (int q = 0; q < W; ++q) row[q] = columns[q][r];
        V::input(row, transformed);
        for (int q = 0; q < W; ++q) store<L>(out + (r * W + q) * channels + c, transformed[q]);
      }
    }
  }
}

// y tile (=, or +=) A^T m A for each tile, m[t][xi][o]; outputs past the edge are dropped.
// With an epilogue (inference only, write is kOverwrite), each output vector gets the bias, the
// residual and the ReLU before its one store.
template <typename V, int L>
void transform_output(float* y, const float* m, const WinogradShape& shape, int channels,
                      const TileGrid<V>& grid, int64_t first, int count, WinogradWrite write,
                      const WinogradEpilogue* epilogue) {
  constexpr int W = V::kWindow, M = V::kOut;
  TileOrigin<V> origin(first, grid);
  for (int t = 0; t < count; ++t, origin.next()) {
    const float* at = m + static_cast<int64_t>(t) * V::kPoints * channels;
    const int rows = at_most(M, shape.height - origin.row);
    const int cols = at_most(M, shape.width - origin.col);
    float* y_tile =
        y + ((static_cast<int64_t>(origin.image) * shape.height + origin.row) * shape.width +
             origin.col) *
                channels;
    for (int c = 0; c < channels; c += L) {
      Vec<L> columns[W][M];  // columns[q] = A^T (column q of m)
      for (int q = 0; q < W; ++q) {
        Vec<L> column[W];
        for (int r = 0; r < W; ++r) column[r] = load<L>(at + (r * W + q) * channels + c);
        V::output(column, columns[q]);
      }
      for (int r = 0; r < rows; ++r) {
        Vec<L> row[W], outputs[M];
        for (int q = 0; q < W; ++q) row[q] = columns[q][r];
        V::output(row, outputs);
        for (int q = 0; q < cols; ++q) {
          const int64_t offset = (static_cast<int64_t>(r) * shape.width + q) * channels + c;
          float* to = y_tile + offset;
          if (epilogue != nullptr) {
            Vec<L> value = outputs[q];
            if (epilogue->bias != nullptr) value += load<L>(epilogue->bias + c);
            if (epilogue->residual != nullptr) value += load<L>(epilogue->residual + (to - y));
            if (epilogue->relu) value = value > 0.0f ? value : Vec<L>{};
            store<L>(to, value);
          } else {
            store<L>(to,
                     write == WinogradWrite::kAccumulate ? load<L>(to) + outputs[q] : outputs[q]);
          }
        }
      }
    }
  }
}

// g[t][xi][o] = (A dy_tile A^T)[xi], dy_tile the tile's outputs' gradient (zero past the edge).
template <typename V, int L>
void transform_output_grad(float* g, const float* dy, const WinogradShape& shape, int channels,
                           const TileGrid<V>& grid, int64_t first, int count) {
  constexpr int W = V::kWindow, M = V::kOut;
  const float* zeros = zero_channels(channels);
  TileOrigin<V> origin(first, grid);
  for (int t = 0; t < count; ++t, origin.next()) {
    const float* window[M][M];
    for (int r = 0; r < M; ++r)
      for (int q = 0; q < M; ++q)
        window[r][q] =
            origin.row + r < shape.height && origin.col + q < shape.width
                ? dy + ((static_cast<int64_t>(origin.image) * shape.height + origin.row + r) *
                            shape.width +
                        origin.col + q) *
                           channels
                : zeros;
    float* out = g + static_cast<int64_t>(t) * V::kPoints * channels;
    for (int c = 0; c < channels; c += L) {
      Vec<L> columns[M][W];  // columns[q] = A (column q of dy)
      for (int q = 0; q < M; ++q) {
        Vec<L> column[M];
        for (int r = 0; r < M; ++r) column[r] = load<L>(window[r][q] + c);
        V::grad(column, columns[q]);
      }
      for (int r = 0; r < W; ++r) {
        Vec<L> row[M], transformed[W];
        for (int q = 0; q < M; ++q) row[q] = columns[q][r];
        V::grad(row, transformed);
        for (int q = 0; q < W; ++q) store<L>(out + (r * W + q) * channels + c, transformed[q]);
      }
    }
  }
}

template <typename V, int L>
void conv(float* y, const float* x, const float* transformed, const WinogradShape& shape,
          WinogradWrite write, const WinogradEpilogue* epilogue) {
  const TileGrid<V> grid(shape);
  const int in = shape.in_channels, out = shape.out_channels;
  const int block = block_tiles<V, L>(in, out);
  const int64_t blocks = (grid.count + block - 1) / block;
#pragma omp parallel
  {
    float* v = thread_buffer(BufferSlot::kInput, static_cast<int64_t>(V::kPoints) * block * in);
    float* m = thread_buffer(BufferSlot::kProduct, static_cast<int64_t>(V::kPoints) * block * out);
#pragma omp for schedule(static)
    for (int64_t index = 0; index < blocks; ++index) {
      const int64_t first = index * block;
      const int count = static_cast<int>(at_most<int64_t>(block, grid.count - first));
      transform_input<V, L>(v, x, shape, in, grid, first, count);
      for (int xi = 0; xi < V::kPoints; ++xi)
        multiply<L>(m + static_cast<int64_t>(xi) * out, V::kPoints * out,
                    v + static_cast<int64_t>(xi) * in, V::kPoints * in, 1,
                    transformed + static_cast<int64_t>(xi) * in * out, out, count, out, in,
                    WinogradWrite::kOverwrite);
      transform_output<V, L>(y, m, shape, out, grid, first, count, write, epilogue);
    }
  }
}

// du[xi][o][c] = sum over tiles of g[t][xi][o] v[t][xi][c], per thread in a fixed block order and
// summed over threads in thread order, so a given thread count always gives the same bits.
// Then weight_grad[o][c] += G^T du[.][o][c] G.
template <typename V, int L>
void conv_weight_grad(float* weight_grad, const float* x, const float* dy,
                      const WinogradShape& shape) {
  constexpr int W = V::kWindow;
  const TileGrid<V> grid(shape);
  const int in = shape.in_channels, out = shape.out_channels;
  const int block = block_tiles<V, L>(in, out);
  const int64_t blocks = (grid.count + block - 1) / block;
  const int64_t du_numel = static_cast<int64_t>(V::kPoints) * in * out;
  // Each thread's partial du lives in its own reused buffer; its first block overwrites it, so
  // nothing is zeroed. A thread that got no block leaves nullptr.
  const int threads = omp_get_max_threads();
  float** partials = thread_partials(threads);
#pragma omp parallel
  {
    float* v = thread_buffer(BufferSlot::kInput, static_cast<int64_t>(V::kPoints) * block * in);
    float* g = thread_buffer(BufferSlot::kProduct, static_cast<int64_t>(V::kPoints) * block * out);
    float* du = thread_buffer(BufferSlot::kWeightGrad, du_numel);
    WinogradWrite write = WinogradWrite::kOverwrite;
#pragma omp for schedule(static)
    for (int64_t index = 0; index < blocks; ++index) {
      const int64_t first = index * block;
      const int count = static_cast<int>(at_most<int64_t>(block, grid.count - first));
      transform_input<V, L>(v, x, shape, in, grid, first, count);
      transform_output_grad<V, L>(g, dy, shape, out, grid, first, count);
      for (int xi = 0; xi < V::kPoints; ++xi)
        multiply<L>(du + xi * static_cast<int64_t>(out) * in, in,
                    g + static_cast<int64_t>(xi) * out, 1, V::kPoints * out,
                    v + static_cast<int64_t>(xi) * in, V::kPoints * in, out, in, count, write);
      write = WinogradWrite::kAccumulate;
      partials[omp_get_thread_num()] = du;
    }
  }
  float* du = partials[0];  // thread 0 always gets the first block under schedule(static)
  for (int thread = 1; thread < threads; ++thread)
    if (partials[thread] != nullptr)
      for (int64_t i = 0; i < du_numel; ++i) du[i] += partials[thread][i];
  // L neighbouring (o, c) pairs at a time, as vector lanes (see transform_weights).
  const int64_t point_stride = static_cast<int64_t>(out) * in;
  for (int64_t pair = 0; pair < point_stride; pair += L) {  // pair = o * in + c
    Vec<L> columns[W][3];                                   // columns[s] = G^T (column s of du)
    for (int s = 0; s < W; ++s) {
      Vec<L> column[W];
      for (int r = 0; r < W; ++r) column[r] = load<L>(du + (r * W + s) * point_stride + pair);
      V::kernel_grad(column, columns[s]);
    }
    float taps[9][L];  // taps[tap][lane]
    for (int p = 0; p < 3; ++p) {
      Vec<L> row[W], row_taps[3];
      for (int s = 0; s < W; ++s) row[s] = columns[s][p];
      V::kernel_grad(row, row_taps);
      for (int q = 0; q < 3; ++q) store<L>(taps[3 * p + q], row_taps[q]);
    }
    for (int lane = 0; lane < L; ++lane)
      for (int tap = 0; tap < 9; ++tap) weight_grad[(pair + lane) * 9 + tap] += taps[tap][lane];
  }
}

template <int L>
KernelTable kernels_of_width() {
  KernelTable table;
  table.conv_f2 = &conv<F2, L>;
  table.conv_f4 = &conv<F4, L>;
  table.weight_grad_f2 = &conv_weight_grad<F2, L>;
  table.weight_grad_f4 = &conv_weight_grad<F4, L>;
  return table;
}

}  // namespace
}  // namespace ft::winograd
