// Tests for fusion/ops/attention_tile_gemm.h, the register-blocked GEMM inside FlashAttentionOp's
// tiles: against a double-precision loop, for every row count of a block, both layouts of A, one
// and two vectors of columns, depth ranges that start after 0, and accumulate against overwrite.
// Entries of C outside the block must stay untouched.
#include "fusion/ops/attention_tile_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"

namespace ft {
namespace {

using attention_tile::ALayout;
using attention_tile::gemm_row_block;
using attention_tile::kLanes;
using attention_tile::kRowBlock;

struct Case {
  ALayout layout;
  int64_t rows, columns, k_begin, k_end;
  bool accumulate;
};

void expect_block_matches(const Case& c) {
  const int64_t depth = 37, lda_rows = 45, ldb = 3 * kLanes + 5, ldc = 3 * kLanes + 3;
  // A as rows: [rows][depth] with lda = lda_rows; as columns: [depth][rows] with lda = lda_rows.
  const int64_t lda = lda_rows;
  std::vector<float> a(lda * (depth > kRowBlock ? depth : kRowBlock) + lda), b(depth * ldb);
  std::vector<float> c_out(kRowBlock * ldc + kLanes), c_before;
  Rng rng(static_cast<uint64_t>(c.rows * 131 + c.columns * 7 + c.k_begin));
  for (float& x : a) x = rng.normal();
  for (float& x : b) x = rng.normal();
  for (float& x : c_out) x = rng.normal();
  c_before = c_out;
  if (c.layout == ALayout::kRows)
    gemm_row_block<ALayout::kRows>(c_out.data(), ldc, a.data(), lda, b.data(), ldb, c.rows,
                                   c.columns, c.k_begin, c.k_end, c.accumulate);
  else
    gemm_row_block<ALayout::kColumns>(c_out.data(), ldc, a.data(), lda, b.data(), ldb, c.rows,
                                      c.columns, c.k_begin, c.k_end, c.accumulate);
  for (int64_t r = 0; r < kRowBlock; ++r)
    for (int64_t n = 0; n < ldc; ++n) {
      const float got = c_out[r * ldc + n];
      if (r >= c.rows || n >= c.columns) {
        ASSERT_EQ(got, c_before[r * ldc + n]) << "outside the block at " << r << "," << n;
        continue;
      }
      double want = c.accumulate ? c_before[r * ldc + n] : 0.0;
      for (int64_t k = c.k_begin; k < c.k_end; ++k) {
        const float a_rk = c.layout == ALayout::kRows ? a[r * lda + k] : a[k * lda + r];
        want += static_cast<double>(a_rk) * b[k * ldb + n];
      }
      ASSERT_NEAR(got, want, 1e-5 * (1.0 + std::fabs(want)))
          << "rows " << c.rows << " columns " << c.columns << " depth [" << c.k_begin << ", "
          << c.k_end << ") at " << r << "," << n;
    }
}

TEST(AttentionTileGemm, MatchesADoubleLoopForEveryBlockShape) {
  for (ALayout layout : {ALayout::kRows, ALayout::kColumns})
    for (int64_t rows = 1; rows <= kRowBlock; ++rows)
      for (int64_t columns : {int64_t{kLanes}, int64_t{2 * kLanes}, int64_t{3 * kLanes}})
        for (auto [k_begin, k_end] : {std::pair<int64_t, int64_t>{0, 37}, {5, 37}, {3, 4}, {9, 9}})
          for (bool accumulate : {false, true})
            expect_block_matches({layout, rows, columns, k_begin, k_end, accumulate});
}

}  // namespace
}  // namespace ft
