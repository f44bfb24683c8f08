// Winograd F(2x2, 3x3) convolution, forward/backward data and weight gradient, on NHWC.
// Tiles (one per 2x2 block of outputs, numbered over batch, rows, columns) are processed in
// blocks small enough that a block's transformed input and its GEMM products stay in L2:
//   1. transform each tile's 4x4 input window: v[xi][tile][c]          (adds only)
//   2. 16 GEMMs, one per transform point xi: m[xi] = v[xi] * U[xi]      (the multiplies)
//   3. transform back to the 2x2 outputs and write (or add) them        (adds only)
// The transforms vectorise over 8 channels; the GEMMs use a 6x16 register tile, 12 AVX
// accumulators, written with GCC vector extensions so the compiler emits FMAs for the target.
#include "model/ops/winograd.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/check.h"

namespace ft {
namespace {

// Eight floats; aligned(4) lets it load and store at any float address.
typedef float Vec8 __attribute__((vector_size(32), aligned(4), may_alias));

inline Vec8 load8(const float* at) { return *reinterpret_cast<const Vec8*>(at); }
inline void store8(float* at, Vec8 value) { *reinterpret_cast<Vec8*>(at) = value; }

constexpr int kPoints = 16;  // a 4x4 transformed tile
constexpr int kRows = 6;     // register tile of the GEMMs: 6 rows x 16 columns
constexpr int kCols = 16;

struct TileGrid {
  explicit TileGrid(const WinogradShape& shape)
      : rows((shape.height + 1) / 2),
        cols((shape.width + 1) / 2),
        count(static_cast<int64_t>(shape.batch) * rows * cols) {}
  int rows, cols;
  int64_t count;
};

// Where a tile's 2x2 outputs start: image, row, column. Walks the tiles in order with next(),
// since a division per tile cost more than a third of a 16-channel transform.
struct TileOrigin {
  TileOrigin(int64_t tile, const TileGrid& grid)
      : image(static_cast<int>(tile / (grid.rows * grid.cols))),
        row(2 * static_cast<int>(tile % (grid.rows * grid.cols) / grid.cols)),
        col(2 * static_cast<int>(tile % grid.cols)),
        last_col(2 * (grid.cols - 1)),
        last_row(2 * (grid.rows - 1)) {}
  void next() {
    if (col < last_col) {
      col += 2;
      return;
    }
    col = 0;
    if (row < last_row) {
      row += 2;
      return;
    }
    row = 0;
    ++image;
  }
  int image, row, col;
  int last_col, last_row;
};

// Tiles per block: 16 x tiles x (in + out) floats, the block's working set, near 256 KB.
int block_tiles(int in_channels, int out_channels) {
  int tiles = 4096 / (in_channels + out_channels);
  tiles -= tiles % kRows;
  return std::max(kRows, tiles);
}

// `channels` zeros that loads of the padding point at, so the inner loops never branch.
const float* zero_channels(int channels) {
  thread_local std::vector<float> zeros;
  if (static_cast<int>(zeros.size()) < channels) zeros.assign(channels, 0.0f);
  return zeros.data();
}

// v[xi][t][c] = (B^T d B)[xi] for the `count` tiles from `first`, d the tile's 4x4 window of x
// starting one row and column before its outputs (zero outside x: the padding).
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], applied to the rows, then to the columns.
void transform_input(float* v, int64_t v_stride, const float* x, const WinogradShape& shape,
                     int channels, const TileGrid& grid, int64_t first, int count) {
  const float* zeros = zero_channels(channels);
  const int64_t image_size = static_cast<int64_t>(shape.height) * shape.width * channels;
  TileOrigin origin(first, grid);
  for (int t = 0; t < count; ++t, origin.next()) {
    const float* window[4][4];
    for (int r = 0; r < 4; ++r) {
      const int row = origin.row - 1 + r;
      const bool row_inside = row >= 0 && row < shape.height;
      for (int q = 0; q < 4; ++q) {
        const int col = origin.col - 1 + q;
        window[r][q] = row_inside && col >= 0 && col < shape.width
                           ? x + origin.image * image_size +
                                 (static_cast<int64_t>(row) * shape.width + col) * channels
                           : zeros;
      }
    }
    // The next tile along the row reads two new columns; ask for them now, since waiting on them
    // in the loop below cost as much as the transform's arithmetic.
    for (int r = 0; r < 4; ++r)
      if (window[r][3] != zeros)
        for (int line = 0; line < 2 * channels; line += 16)
          __builtin_prefetch(window[r][3] + channels + line);
    float* out = v + static_cast<int64_t>(t) * channels;
    for (int c = 0; c < channels; c += 8) {
      Vec8 e[4][4];
      for (int q = 0; q < 4; ++q) {
        const Vec8 d0 = load8(window[0][q] + c), d1 = load8(window[1][q] + c);
        const Vec8 d2 = load8(window[2][q] + c), d3 = load8(window[3][q] + c);
        e[0][q] = d0 - d2;
        e[1][q] = d1 + d2;
        e[2][q] = d2 - d1;
        e[3][q] = d1 - d3;
      }
      for (int r = 0; r < 4; ++r) {
        float* to = out + 4 * r * v_stride + c;
        store8(to, e[r][0] - e[r][2]);
        store8(to + v_stride, e[r][1] + e[r][2]);
        store8(to + 2 * v_stride, e[r][2] - e[r][1]);
        store8(to + 3 * v_stride, e[r][1] - e[r][3]);
      }
    }
  }
}

// y tile (=, or +=) A^T m A for each tile, m[xi][t][o]; outputs past the edge are dropped.
//   A^T = [1 1 1 0; 0 1 -1 -1].
void transform_output(float* y, const float* m, int64_t m_stride, const WinogradShape& shape,
                      int channels, const TileGrid& grid, int64_t first, int count,
                      WinogradWrite write) {
  TileOrigin origin(first, grid);
  for (int t = 0; t < count; ++t, origin.next()) {
    for (int c = 0; c < channels; c += 8) {
      const float* at = m + static_cast<int64_t>(t) * channels + c;
      Vec8 f[2][4];
      for (int q = 0; q < 4; ++q) {
        const Vec8 m0 = load8(at + q * m_stride), m1 = load8(at + (4 + q) * m_stride);
        const Vec8 m2 = load8(at + (8 + q) * m_stride), m3 = load8(at + (12 + q) * m_stride);
        f[0][q] = m0 + m1 + m2;
        f[1][q] = m1 - m2 - m3;
      }
      for (int r = 0; r < 2; ++r) {
        const int row = origin.row + r;
        if (row >= shape.height) continue;
        const Vec8 out[2] = {f[r][0] + f[r][1] + f[r][2], f[r][1] - f[r][2] - f[r][3]};
        for (int q = 0; q < 2; ++q) {
          const int col = origin.col + q;
          if (col >= shape.width) continue;
          float* to = y + ((static_cast<int64_t>(origin.image) * shape.height + row) * shape.width +
                           col) * channels + c;
          store8(to, write == WinogradWrite::kAccumulate ? load8(to) + out[q] : out[q]);
        }
      }
    }
  }
}

// g[xi][t][o] = (A dy_tile A^T)[xi], dy_tile the tile's 2x2 outputs (zero past the edge).
//   A z = (z0, z0 + z1, z0 - z1, -z1), applied to the rows, then to the columns.
void transform_output_grad(float* g, int64_t g_stride, const float* dy, const WinogradShape& shape,
                           int channels, const TileGrid& grid, int64_t first, int count) {
  const float* zeros = zero_channels(channels);
  TileOrigin origin(first, grid);
  for (int t = 0; t < count; ++t, origin.next()) {
    const float* window[2][2];
    for (int r = 0; r < 2; ++r)
      for (int q = 0; q < 2; ++q)
        window[r][q] = origin.row + r < shape.height && origin.col + q < shape.width
                           ? dy + ((static_cast<int64_t>(origin.image) * shape.height +
                                    origin.row + r) * shape.width + origin.col + q) * channels
                           : zeros;
    float* out = g + static_cast<int64_t>(t) * channels;
    for (int c = 0; c < channels; c += 8) {
      const Vec8 d00 = load8(window[0][0] + c), d01 = load8(window[0][1] + c);
      const Vec8 d10 = load8(window[1][0] + c), d11 = load8(window[1][1] + c);
      const Vec8 e[4][2] = {{d00, d01}, {d00 + d10, d01 + d11}, {d00 - d10, d01 - d11}, {-d10, -d11}};
      for (int r = 0; r < 4; ++r) {
        float* to = out + 4 * r * g_stride + c;
        store8(to, e[r][0]);
        store8(to + g_stride, e[r][0] + e[r][1]);
        store8(to + 2 * g_stride, e[r][0] - e[r][1]);
        store8(to + 3 * g_stride, -e[r][1]);
      }
    }
  }
}

// c[r][0..16) (=, or +=) sum_k a[r * a_row + k * a_k] * b[k * ldb + 0..16), r < Rows. The
// accumulators live in registers for the whole depth; Rows is a template argument so that the
// loops over rows unroll and they can.
template <int Rows>
void multiply_tile(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k,
                   const float* b, int64_t ldb, int depth, WinogradWrite write) {
  Vec8 acc[Rows][2] = {};
  for (int k = 0; k < depth; ++k) {
    const Vec8 b_low = load8(b + k * ldb), b_high = load8(b + k * ldb + 8);
    for (int r = 0; r < Rows; ++r) {
      const float a_value = a[r * a_row + k * a_k];
      acc[r][0] += a_value * b_low;
      acc[r][1] += a_value * b_high;
    }
  }
  for (int r = 0; r < Rows; ++r) {
    float* row = c + r * ldc;
    if (write == WinogradWrite::kAccumulate) {
      acc[r][0] += load8(row);
      acc[r][1] += load8(row + 8);
    }
    store8(row, acc[r][0]);
    store8(row + 8, acc[r][1]);
  }
}

// c[rows x cols] (=, or +=) a * b with a(r, k) = a[r * a_row + k * a_k], b row-major (ldb).
// REQUIRES: cols a multiple of 16.
void multiply(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b,
              int64_t ldb, int rows, int cols, int depth, WinogradWrite write) {
  for (int col = 0; col < cols; col += kCols)
    for (int row = 0; row < rows; row += kRows) {
      float* c_tile = c + row * ldc + col;
      const float* a_tile = a + row * a_row;
      const float* b_panel = b + col;
      switch (std::min(kRows, rows - row)) {
#define FT_MULTIPLY_CASE(n)                                                        \
  case n:                                                                          \
    multiply_tile<n>(c_tile, ldc, a_tile, a_row, a_k, b_panel, ldb, depth, write); \
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

// Per-thread buffers, each reused by its thread across calls.
enum BufferSlot { kInputSlot, kProductSlot, kSlots };
float* thread_buffer(BufferSlot slot, int64_t count) {
  thread_local std::vector<float> buffers[kSlots];
  std::vector<float>& buffer = buffers[slot];
  if (static_cast<int64_t>(buffer.size()) < count) buffer.resize(count);
  return buffer.data();
}

void check_shape(const WinogradShape& shape) {
  FT_CHECK(shape.batch > 0 && shape.height > 0 && shape.width > 0,
           "winograd: bad shape batch=", shape.batch, " height=", shape.height,
           " width=", shape.width);
  FT_CHECK(winograd_supports(shape.in_channels, shape.out_channels),
           "winograd: channels must be multiples of 16, got in=", shape.in_channels,
           " out=", shape.out_channels);
}

}  // namespace

bool winograd_supports(int in_channels, int out_channels) {
  return in_channels > 0 && out_channels > 0 && in_channels % kCols == 0 &&
         out_channels % kCols == 0;
}

int64_t winograd_weights_numel(int in_channels, int out_channels) {
  return static_cast<int64_t>(kPoints) * in_channels * out_channels;
}

// U = G g G^T, G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], applied to rows then columns.
void winograd_transform_weights(float* transformed, const float* weight, int out_channels,
                                int in_channels, WinogradPass pass) {
  const int64_t point_stride = static_cast<int64_t>(in_channels) * out_channels;
  for (int o = 0; o < out_channels; ++o)
    for (int c = 0; c < in_channels; ++c) {
      const float* w = weight + (static_cast<int64_t>(o) * in_channels + c) * 9;
      float g[3][3];
      for (int tap = 0; tap < 9; ++tap)  // backward data convolves with the flipped kernel
        g[tap / 3][tap % 3] = pass == WinogradPass::kForward ? w[tap] : w[8 - tap];
      float h[4][3];
      for (int q = 0; q < 3; ++q) {
        h[0][q] = g[0][q];
        h[1][q] = 0.5f * (g[0][q] + g[1][q] + g[2][q]);
        h[2][q] = 0.5f * (g[0][q] - g[1][q] + g[2][q]);
        h[3][q] = g[2][q];
      }
      const int64_t at = pass == WinogradPass::kForward
                             ? static_cast<int64_t>(c) * out_channels + o
                             : static_cast<int64_t>(o) * in_channels + c;
      for (int r = 0; r < 4; ++r) {
        const float u[4] = {h[r][0], 0.5f * (h[r][0] + h[r][1] + h[r][2]),
                            0.5f * (h[r][0] - h[r][1] + h[r][2]), h[r][2]};
        for (int s = 0; s < 4; ++s) transformed[(4 * r + s) * point_stride + at] = u[s];
      }
    }
}

void winograd_conv(float* y, const float* x, const float* transformed, const WinogradShape& shape,
                   WinogradWrite write) {
  check_shape(shape);
  const TileGrid grid(shape);
  const int in = shape.in_channels, out = shape.out_channels;
  const int block = block_tiles(in, out);
  const int64_t blocks = (grid.count + block - 1) / block;
#pragma omp parallel
  {
    float* v = thread_buffer(kInputSlot, static_cast<int64_t>(kPoints) * block * in);
    float* m = thread_buffer(kProductSlot, static_cast<int64_t>(kPoints) * block * out);
#pragma omp for schedule(static)
    for (int64_t index = 0; index < blocks; ++index) {
      const int64_t first = index * block;
      const int count = static_cast<int>(std::min<int64_t>(block, grid.count - first));
      transform_input(v, static_cast<int64_t>(block) * in, x, shape, in, grid, first, count);
      for (int xi = 0; xi < kPoints; ++xi)
        multiply(m + static_cast<int64_t>(xi) * block * out, out,
                 v + static_cast<int64_t>(xi) * block * in, in, 1,
                 transformed + static_cast<int64_t>(xi) * in * out, out, count, out, in,
                 WinogradWrite::kOverwrite);
      transform_output(y, m, static_cast<int64_t>(block) * out, shape, out, grid, first, count,
                       write);
    }
  }
}

// du[xi][o][c] = sum over tiles of g[xi][t][o] v[xi][t][c], per thread in a fixed block order and
// summed over threads in thread order, so a given thread count always gives the same bits.
// Then weight_grad += G^T du G, G^T = [1 1/2 1/2 0; 0 1/2 -1/2 0; 0 1/2 1/2 1].
void winograd_conv_weight_grad(float* weight_grad, const float* x, const float* dy,
                               const WinogradShape& shape) {
  check_shape(shape);
  const TileGrid grid(shape);
  const int in = shape.in_channels, out = shape.out_channels;
  const int block = block_tiles(in, out);
  const int64_t blocks = (grid.count + block - 1) / block;
  const int64_t du_numel = winograd_weights_numel(in, out);
  std::vector<std::vector<float>> partials(omp_get_max_threads());
#pragma omp parallel
  {
    float* v = thread_buffer(kInputSlot, static_cast<int64_t>(kPoints) * block * in);
    float* g = thread_buffer(kProductSlot, static_cast<int64_t>(kPoints) * block * out);
    std::vector<float>& du = partials[omp_get_thread_num()];
    du.assign(du_numel, 0.0f);
#pragma omp for schedule(static)
    for (int64_t index = 0; index < blocks; ++index) {
      const int64_t first = index * block;
      const int count = static_cast<int>(std::min<int64_t>(block, grid.count - first));
      transform_input(v, static_cast<int64_t>(block) * in, x, shape, in, grid, first, count);
      transform_output_grad(g, static_cast<int64_t>(block) * out, dy, shape, out, grid, first,
                            count);
      for (int xi = 0; xi < kPoints; ++xi)
        multiply(du.data() + xi * static_cast<int64_t>(out) * in, in,
                 g + static_cast<int64_t>(xi) * block * out, 1, out,
                 v + static_cast<int64_t>(xi) * block * in, in, out, in, count,
                 WinogradWrite::kAccumulate);
    }
  }
  std::vector<float>& du = partials[0];
  for (size_t thread = 1; thread < partials.size(); ++thread)
    for (int64_t i = 0; i < static_cast<int64_t>(partials[thread].size()); ++i)
      du[i] += partials[thread][i];
  const int64_t point_stride = static_cast<int64_t>(out) * in;
  for (int64_t pair = 0; pair < point_stride; ++pair) {  // pair = o * in + c
    float u[4][4];
    for (int xi = 0; xi < kPoints; ++xi) u[xi / 4][xi % 4] = du[xi * point_stride + pair];
    float h[3][4];
    for (int s = 0; s < 4; ++s) {
      h[0][s] = u[0][s] + 0.5f * (u[1][s] + u[2][s]);
      h[1][s] = 0.5f * (u[1][s] - u[2][s]);
      h[2][s] = 0.5f * (u[1][s] + u[2][s]) + u[3][s];
    }
    float* dw = weight_grad + pair * 9;
    for (int p = 0; p < 3; ++p) {
      dw[3 * p + 0] += h[p][0] + 0.5f * (h[p][1] + h[p][2]);
      dw[3 * p + 1] += 0.5f * (h[p][1] - h[p][2]);
      dw[3 * p + 2] += 0.5f * (h[p][1] + h[p][2]) + h[p][3];
    }
  }
}

}  // namespace ft
