// Fused causal attention (see flash_attention.h). One OpenMP task per (b, h). The head's q, k, v
// (and dY) rows are read in place for short heads (kInPlaceRows), else packed with hd padded to
// a whole number of vectors; every product inside a tile (S = Q K^T, Y += P V and the five of
// backward) is a register-blocked small GEMM (attention_tile_gemm.h) over exactly the causal range
// its rows can see. Key tiles are packed transposed, kt[d][s], with the softmax scale folded in, so
// a row block of S is kRowBlock rows by two vectors of accumulators over hd steps.
#include "fusion/ops/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/math/bf16_math.h"
#include "core/math/fast_exp.h"
#include "fusion/ops/attention_tile_gemm.h"
#include "kernels/attention_heads.h"
#include "kernels/online_softmax.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

using attention_tile::ALayout;
using attention_tile::aligned_row;
using attention_tile::gemm_row_block;
using attention_tile::kColumnBlock;
using attention_tile::kLanes;
using attention_tile::kRowBlock;
using attention_tile::round_up;
using attention_tile::VectorBuffer;

// A head's rows as the tile GEMMs read or write them: row t at data + t * ld, hd (or width)
// floats.
template <typename Float>
struct Rows {
  Float* data;
  int64_t ld;
  Rows at(int64_t row) const { return {data + row * ld, ld}; }
};
using ConstRows = Rows<const float>;
using MutableRows = Rows<float>;

// packed[t * width + d] = rows[t * stride + d] for d < hd, and 0 for hd <= d < width.
void pack_rows(float* packed, const float* rows, int64_t stride, int64_t count, int64_t hd,
               int64_t width) {
  for (int64_t t = 0; t < count; ++t) {
    const float* from = rows + t * stride;
    float* to = packed + t * width;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) to[d] = from[d];
    for (int64_t d = hd; d < width; ++d) to[d] = 0.0f;
  }
}

// Heads of at most this many rows are read (and their gradients accumulated) in place when hd is
// a whole number of vectors: 64 strided rows stay in L1, and the copy is saved (1.1-1.2x at
// seq_len 64). Longer heads measured 0.72-0.9x in place at 128-1024 rows, the strided rows
// (1.5 KB apart at gpt_tiny) conflicting in L1's sets, so they are packed.
constexpr int64_t kInPlaceRows = 64;

bool reads_in_place(int64_t seq_len, int64_t hd, int64_t width) {
  return hd == width && seq_len <= kInPlaceRows;
}

// The head's rows as width-float rows: in place (see kInPlaceRows), or packed into `buffer` with
// hd zero-padded to width.
ConstRows head_rows(std::vector<float>& buffer, bool in_place, const float* rows, int64_t stride,
                    int64_t count, int64_t hd, int64_t width) {
  if (in_place) return {rows, stride};
  pack_rows(buffer.data(), rows, stride, count, hd, width);
  return {buffer.data(), width};
}

// kt[d * ld + s] = factor * rows[s][d] for s < count, d < width, and 0 for count <= s < ld.
void pack_transposed(float* kt, ConstRows rows, int64_t count, int64_t width, int64_t ld,
                     float factor) {
  // Contiguous stores, strided loads: scattered stores cost several times more.
  for (int64_t d = 0; d < width; ++d) {
    float* kt_row = kt + d * ld;
    for (int64_t s = 0; s < count; ++s) kt_row[s] = factor * rows.data[s * rows.ld + d];
    for (int64_t s = count; s < ld; ++s) kt_row[s] = 0.0f;
  }
}

// rows[t * stride + d] += packed[t * width + d] for t < count, d < hd.
void add_rows(float* rows, int64_t stride, const float* packed, int64_t count, int64_t hd,
              int64_t width) {
  for (int64_t t = 0; t < count; ++t) {
    float* row = rows + t * stride;
    const float* from = packed + t * width;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) row[d] += from[d];
  }
}

// Where a gradient's rows accumulate: in place, or in `buffer` (zeroed here), which the caller
// adds into the strided rows afterwards (add_rows).
MutableRows gradient_rows(std::vector<float>& buffer, bool in_place, float* rows, int64_t stride,
                          int64_t width) {
  if (in_place) return {rows, stride};
  std::fill(buffer.begin(), buffer.end(), 0.0f);
  return {buffer.data(), width};
}

constexpr float kMasked = -std::numeric_limits<float>::infinity();

// Sets row[s] = kMasked for count <= s < round_up(count, kLanes) and returns that bound.
int64_t mask_invisible(float* row, int64_t count) {
  const int64_t lanes = round_up(count, kLanes);
  std::fill(row + count, row + lanes, kMasked);
  return lanes;
}

// One (query tile, key tile) pair of one head. Query rows [i0, i0 + rows) of the tile against keys
// [j0, j0 + keys); tiles are aligned, so j0 <= i0 and every query row sees at least key j0.
struct TilePair {
  int64_t i0, rows, j0, keys;
  // Keys of the tile that query row i0 + r (tile-relative r) sees: s <= t.
  int64_t visible(int64_t r) const { return std::min(keys, i0 + r + 1 - j0); }
};

// out[r][s] = sum_d a[r][d] bt[d][s] for every row block of the pair, over the columns each block
// sees (rounded up to a vector; bt's padding columns are zero).
void causal_scores(float* out, int64_t ld, ConstRows a, int64_t width, const float* bt,
                   const TilePair& pair) {
  for (int64_t r0 = 0; r0 < pair.rows; r0 += kRowBlock) {
    const int64_t block_rows = std::min<int64_t>(kRowBlock, pair.rows - r0);
    const int64_t columns = round_up(pair.visible(r0 + block_rows - 1), kLanes);
    gemm_row_block<ALayout::kRows>(out + r0 * ld, ld, a.data + r0 * a.ld, a.ld, bt, ld, block_rows,
                                   columns, 0, width, false);
  }
}

// out[r][.] += sum_{s visible to r} weights[r][s] rows[s][.]  (Y += P V and dQ += dS K).
void causal_mix(MutableRows out, const float* weights, int64_t ld, ConstRows rows, int64_t width,
                const TilePair& pair) {
  for (int64_t r0 = 0; r0 < pair.rows; r0 += kRowBlock) {
    const int64_t block_rows = std::min<int64_t>(kRowBlock, pair.rows - r0);
    gemm_row_block<ALayout::kRows>(out.data + r0 * out.ld, out.ld, weights + r0 * ld, ld, rows.data,
                                   rows.ld, block_rows, width, 0, pair.visible(r0 + block_rows - 1),
                                   true);
  }
}

// out[s][.] += sum_{r that sees s} weights[r][s] rows[r][.]  (dV += P^T dY and dK += dS^T Q):
// query row r sees key s when i0 + r >= j0 + s, so a key block starting at s0 skips the rows
// before j0 + s0 - i0.
void causal_mix_transposed(MutableRows out, const float* weights, int64_t ld, ConstRows rows,
                           int64_t width, const TilePair& pair) {
  for (int64_t s0 = 0; s0 < pair.keys; s0 += kRowBlock) {
    const int64_t block_keys = std::min<int64_t>(kRowBlock, pair.keys - s0);
    const int64_t first_row = std::max<int64_t>(0, pair.j0 + s0 - pair.i0);
    gemm_row_block<ALayout::kColumns>(out.data + s0 * out.ld, out.ld, weights + s0, ld, rows.data,
                                      rows.ld, block_keys, width, first_row, pair.rows, true);
  }
}

}  // namespace

void flash_attention_forward(float* y, float* lse, const float* q, const float* k, const float* v,
                             const AttentionStrides& strides, int batch, int seq_len, int channels,
                             int n_head, int tile, TileRounding rounding) {
  const int64_t T = seq_len, hd = channels / n_head, heads = static_cast<int64_t>(batch) * n_head;
  const int64_t width = round_up(hd, kLanes);
  const int64_t tile_rows = std::min<int64_t>(tile, T), ld = round_up(tile_rows, kColumnBlock);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel if (heads > 1)
  {
    const bool in_place = reads_in_place(T, hd, width);
    std::vector<float> q_buffer, k_buffer, v_buffer;  // packed rows, unless read in place
    if (!in_place)
      q_buffer.resize(T * width), k_buffer.resize(T * width), v_buffer.resize(T * width);
    std::vector<float> kt(width * ld), out(tile_rows * width);
    VectorBuffer probs(tile_rows * ld);
    std::vector<OnlineSoftmax> row_state(tile_rows);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / n_head, h = bh % n_head;
      const ConstRows q_rows =
          head_rows(q_buffer, in_place, q + b * T * strides.q + h * hd, strides.q, T, hd, width);
      const ConstRows k_rows =
          head_rows(k_buffer, in_place, k + b * T * strides.k + h * hd, strides.k, T, hd, width);
      const ConstRows v_rows =
          head_rows(v_buffer, in_place, v + b * T * strides.v + h * hd, strides.v, T, hd, width);
      float* yh = y + b * T * strides.y + h * hd;
      for (int64_t i0 = 0; i0 < T; i0 += tile_rows) {
        const int64_t rows = std::min(i0 + tile_rows, T) - i0;
        std::fill(row_state.begin(), row_state.end(), OnlineSoftmax{});
        std::fill(out.begin(), out.end(), 0.0f);
        // Causal: key tiles starting after the query tile's last row contribute nothing.
        for (int64_t j0 = 0; j0 < i0 + rows; j0 += tile_rows) {
          const TilePair pair{i0, rows, j0, std::min(j0 + tile_rows, T) - j0};
          pack_transposed(kt.data(), k_rows.at(j0), pair.keys, width, ld, scale);
          causal_scores(probs.data(), ld, q_rows.at(i0), width, kt.data(), pair);
          for (int64_t r = 0; r < rows; ++r) {
            float* row = aligned_row(probs.data() + r * ld);
            const int64_t count = pair.visible(r);
            // Whole vectors, the keys the row cannot see (causal_scores computed them, from
            // later keys or the zero padding) masked to -inf and selected away by value: a scalar
            // tail loop would cost more than the masked lanes, and a select on s < count would
            // be split by GCC into two loops again. Selects, not std::max, so the loops
            // vectorise.
            const int64_t lanes = mask_invisible(row, count);
            float tile_max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : tile_max)
            for (int64_t s = 0; s < lanes; ++s) tile_max = row[s] > tile_max ? row[s] : tile_max;
            // Online softmax (kernels/online_softmax.h): with m' = max(m, tile max), the
            // earlier terms of l and of the output were weighted by exp(S - m) and are rescaled
            // by exp(m - m').
            OnlineSoftmax& state = row_state[r];
            const float rescale = online_softmax_rescale(state, tile_max);
            const float new_max = state.max;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t s = 0; s < lanes; ++s) {
              row[s] = row[s] == kMasked ? 0.0f : online_softmax_weight(row[s], new_max);
              sum += row[s];
            }
            // The sum above is of the unrounded weights, as in the bf16 kernels.
            if (rounding == TileRounding::kBf16) {
#pragma omp simd
              for (int64_t s = 0; s < lanes; ++s) row[s] = round_to_bf16(row[s]);
            }
            // Keys the row cannot see weigh 0 in its row block's product below.
            if (lanes < pair.keys) std::fill(row + lanes, row + pair.keys, 0.0f);
            online_softmax_accumulate(state, rescale, sum);
            float* out_row = out.data() + r * width;
#pragma omp simd
            for (int64_t d = 0; d < width; ++d) out_row[d] *= rescale;
          }
          causal_mix({out.data(), width}, probs.data(), ld, v_rows.at(j0), width, pair);
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float inv_sum = 1.0f / row_state[r].sum;
          const float* out_row = out.data() + r * width;
          float* y_row = yh + (i0 + r) * strides.y;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) y_row[d] = out_row[d] * inv_sum;
          lse[bh * T + i0 + r] = online_softmax_log_sum_exp(row_state[r]);
        }
      }
    }
  }
}

void flash_attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* y,
                              const float* lse, const float* q, const float* k, const float* v,
                              const AttentionStrides& strides, int batch, int seq_len, int channels,
                              int n_head, int tile, TileRounding rounding) {
  const int64_t T = seq_len, hd = channels / n_head, heads = static_cast<int64_t>(batch) * n_head;
  const int64_t width = round_up(hd, kLanes);
  const int64_t tile_rows = std::min<int64_t>(tile, T), ld = round_up(tile_rows, kColumnBlock);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool round_products = rounding == TileRounding::kBf16;
#pragma omp parallel if (heads > 1)
  {
    // Packed copies and gradient buffers, unless the head is read in place; dY is rounded in its
    // packed copy.
    const bool in_place = reads_in_place(T, hd, width), dy_in_place = in_place && !round_products;
    std::vector<float> q_buffer, k_buffer, v_buffer, dy_buffer, dq_buffer, dk_buffer, dv_buffer;
    if (!in_place) {
      for (std::vector<float>* buffer : {&q_buffer, &k_buffer, &v_buffer, &dq_buffer})
        buffer->resize(T * width);
      dk_buffer.resize(tile_rows * width), dv_buffer.resize(tile_rows * width);
    }
    if (!dy_in_place) dy_buffer.resize(T * width);
    std::vector<float> dot_dy_y(T), kt(width * ld), vt(width * ld);
    VectorBuffer probs(tile_rows * ld), dscores(tile_rows * ld);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / n_head, h = bh % n_head;
      const int64_t q_at = b * T * strides.q + h * hd, k_at = b * T * strides.k + h * hd;
      const int64_t v_at = b * T * strides.v + h * hd, y_at = b * T * strides.y + h * hd;
      const ConstRows q_rows = head_rows(q_buffer, in_place, q + q_at, strides.q, T, hd, width);
      const ConstRows k_rows = head_rows(k_buffer, in_place, k + k_at, strides.k, T, hd, width);
      const ConstRows v_rows = head_rows(v_buffer, in_place, v + v_at, strides.v, T, hd, width);
      const ConstRows dy_rows =
          head_rows(dy_buffer, dy_in_place, dy + y_at, strides.y, T, hd, width);
      if (round_products)
        for (float& value : dy_buffer) value = round_to_bf16(value);
      const MutableRows dq_rows = gradient_rows(dq_buffer, in_place, dq + q_at, strides.q, width);
      const float* lse_h = lse + bh * T;
      // D_t = sum_s P_ts dP_ts = sum_s P_ts <dY_t, V_s> = <dY_t, Y_t>: one dot per row instead
      // of a second pass over the key tiles.
      for (int64_t t = 0; t < T; ++t) {
        const float* dy_row =
            round_products ? dy_rows.data + t * dy_rows.ld : dy + y_at + t * strides.y;
        const float* y_row = y + y_at + t * strides.y;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < hd; ++d) dot += dy_row[d] * y_row[d];
        dot_dy_y[t] = dot;
      }
      // FlashAttention-2's order: a key tile's dK and dV stay in the tile buffers while every
      // query tile that sees it (tiles are aligned, so from i0 = j0 on) goes past.
      for (int64_t j0 = 0; j0 < T; j0 += tile_rows) {
        const int64_t keys = std::min(j0 + tile_rows, T) - j0;
        pack_transposed(kt.data(), k_rows.at(j0), keys, width, ld, scale);
        pack_transposed(vt.data(), v_rows.at(j0), keys, width, ld, 1.0f);
        const MutableRows dk_rows =
            gradient_rows(dk_buffer, in_place, dk + k_at + j0 * strides.k, strides.k, width);
        const MutableRows dv_rows =
            gradient_rows(dv_buffer, in_place, dv + v_at + j0 * strides.v, strides.v, width);
        for (int64_t i0 = j0; i0 < T; i0 += tile_rows) {
          const TilePair pair{i0, std::min(i0 + tile_rows, T) - i0, j0, keys};
          // P_ts = exp(S_ts - L_t), exactly the forward's normalised probabilities;
          // dP_ts = <dY_t, V_s>;  dS_ts = P_ts (dP_ts - D_t), the scale of S folded in, so that
          // dQ_t += sum_s dS_ts K_s and dK_s += sum_t dS_ts Q_t.
          causal_scores(probs.data(), ld, q_rows.at(i0), width, kt.data(), pair);
          causal_scores(dscores.data(), ld, dy_rows.at(i0), width, vt.data(), pair);
          for (int64_t r = 0; r < pair.rows; ++r) {
            float* p_row = aligned_row(probs.data() + r * ld);
            float* ds_row = aligned_row(dscores.data() + r * ld);
            const int64_t count = pair.visible(r);
            const float row_lse = lse_h[i0 + r], row_dot = dot_dy_y[i0 + r];
            const int64_t lanes = mask_invisible(p_row, count);  // as in forward
            if (round_products) {
              // dS from the unrounded P, then rounded before the scale (the eager GEMMs' alpha).
#pragma omp simd
              for (int64_t s = 0; s < lanes; ++s) {
                const float p = p_row[s] == kMasked ? 0.0f : fast_exp(p_row[s] - row_lse);
                ds_row[s] = scale * round_to_bf16(p * (ds_row[s] - row_dot));
                p_row[s] = round_to_bf16(p);
              }
            } else {
#pragma omp simd
              for (int64_t s = 0; s < lanes; ++s) {
                p_row[s] = p_row[s] == kMasked ? 0.0f : fast_exp(p_row[s] - row_lse);
                ds_row[s] = scale * p_row[s] * (ds_row[s] - row_dot);
              }
            }
            if (lanes < keys) {
              std::fill(p_row + lanes, p_row + keys, 0.0f);
              std::fill(ds_row + lanes, ds_row + keys, 0.0f);
            }
          }
          causal_mix_transposed(dv_rows, probs.data(), ld, dy_rows.at(i0), width, pair);
          causal_mix_transposed(dk_rows, dscores.data(), ld, q_rows.at(i0), width, pair);
          causal_mix(dq_rows.at(i0), dscores.data(), ld, k_rows.at(j0), width, pair);
        }
        if (!in_place) {
          add_rows(dk + k_at + j0 * strides.k, strides.k, dk_buffer.data(), keys, hd, width);
          add_rows(dv + v_at + j0 * strides.v, strides.v, dv_buffer.data(), keys, hd, width);
        }
      }
      if (!in_place) add_rows(dq + q_at, strides.q, dq_buffer.data(), T, hd, width);
    }
  }
}

}  // namespace ft
