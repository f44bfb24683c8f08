// The register-blocked small GEMM inside the CPU FlashAttentionOp's tiles: C (+)= A B on blocks
// of at most kTileRowBlock rows of C and one or two vectors of columns, accumulators held in
// registers across the whole depth loop. The attention tiles are too small for a library GEMM's
// call overhead (a 64 x 64 x 32 product is 0.26 MFLOP) and every product has a causal range of its
// own, so each call names the depth range [k_begin, k_end) that its rows can see.
// Vectors are GCC/Clang vector extensions of the widest width the build targets (16 floats with
// AVX-512, 8 with AVX2, 4 with SSE), so the same source is correct, if slower, on any x86.
// Thread safety: pure functions on caller-owned buffers.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

namespace ft::attention_tile {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;  // SSE: wider vector types would change the ABI of load()
#endif
// Columns of C per register block: two vectors.
constexpr int64_t kColumnBlock = 2 * kLanes;
// Rows of C per register block: with two vectors a row that is 8 accumulators, a quarter (AVX-512)
// or half (AVX2) of the vector registers, leaving room for the B row and the broadcast.
constexpr int kRowBlock = 4;

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* from) {
  Vec v;
  std::memcpy(&v, from, sizeof(v));  // unaligned; compiles to one vector load
  return v;
}
inline void store(float* to, const Vec& v) {
  std::memcpy(to, &v, sizeof(v));
}

// How A is laid out: row r, depth k at a[r * lda + k] (kRows), or at a[k * lda + r] (kColumns,
// for the transposed products dV += P^T dY and dK += dS^T Q).
enum class ALayout { kRows, kColumns };

// C[r][0, kVectors * kLanes) (+)= sum_{k in [k_begin, k_end)} A[r][k] B[k][.] for r < kRows.
template <int kRows, int kVectors, ALayout kLayout>
inline __attribute__((always_inline)) void gemm_block(float* c, int64_t ldc, const float* a,
                                                      int64_t lda, const float* b, int64_t ldb,
                                                      int64_t k_begin, int64_t k_end,
                                                      bool accumulate) {
  Vec acc[kRows][kVectors];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v)
      acc[r][v] = accumulate ? load(c + r * ldc + v * kLanes) : Vec{};
  for (int64_t k = k_begin; k < k_end; ++k) {
    Vec b_row[kVectors];
    for (int v = 0; v < kVectors; ++v) b_row[v] = load(b + k * ldb + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const float a_rk = kLayout == ALayout::kRows ? a[r * lda + k] : a[k * lda + r];
      for (int v = 0; v < kVectors; ++v) acc[r][v] += a_rk * b_row[v];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v) store(c + r * ldc + v * kLanes, acc[r][v]);
}

template <int kRows, ALayout kLayout>
inline void gemm_rows(float* c, int64_t ldc, const float* a, int64_t lda, const float* b,
                      int64_t ldb, int64_t columns, int64_t k_begin, int64_t k_end,
                      bool accumulate) {
  int64_t n = 0;
  for (; n + kColumnBlock <= columns; n += kColumnBlock)
    gemm_block<kRows, 2, kLayout>(c + n, ldc, a, lda, b + n, ldb, k_begin, k_end, accumulate);
  if (n < columns)
    gemm_block<kRows, 1, kLayout>(c + n, ldc, a, lda, b + n, ldb, k_begin, k_end, accumulate);
}

// C[rows x columns] (+)= A[rows x depth range] B, for one row block.
// REQUIRES: 1 <= rows <= kRowBlock; columns a multiple of kLanes; with kColumns, `a` points at
// the block's first row (column) so that a[k * lda + r] is row r.
template <ALayout kLayout>
inline void gemm_row_block(float* c, int64_t ldc, const float* a, int64_t lda, const float* b,
                           int64_t ldb, int64_t rows, int64_t columns, int64_t k_begin,
                           int64_t k_end, bool accumulate) {
  static_assert(kRowBlock == 4, "the cases below cover 1..kRowBlock rows");
  switch (rows) {
    case 4:
      return gemm_rows<4, kLayout>(c, ldc, a, lda, b, ldb, columns, k_begin, k_end, accumulate);
    case 3:
      return gemm_rows<3, kLayout>(c, ldc, a, lda, b, ldb, columns, k_begin, k_end, accumulate);
    case 2:
      return gemm_rows<2, kLayout>(c, ldc, a, lda, b, ldb, columns, k_begin, k_end, accumulate);
    default:
      return gemm_rows<1, kLayout>(c, ldc, a, lda, b, ldb, columns, k_begin, k_end, accumulate);
  }
}

// A float buffer that starts on a vector boundary, so that rows of a multiple of kLanes floats all
// do, and loops over them need no scalar peel (see aligned_row).
class VectorBuffer {
 public:
  explicit VectorBuffer(int64_t floats) : storage_((floats + kLanes - 1) / kLanes) {}
  float* data() { return storage_.data()->lanes; }

 private:
  struct alignas(kLanes * sizeof(float)) Lanes {
    float lanes[kLanes] = {};
  };
  std::vector<Lanes> storage_;
};

// REQUIRES: row lies a multiple of kLanes floats into a VectorBuffer.
inline float* aligned_row(float* row) {
  return static_cast<float*>(__builtin_assume_aligned(row, kLanes * sizeof(float)));
}

inline int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace ft::attention_tile
