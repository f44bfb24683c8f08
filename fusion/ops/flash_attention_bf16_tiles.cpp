// The AVX512-BF16 tile kernels of FlashAttentionOp's bf16 path (see flash_attention_bf16.h),
// compiled with AVX512-BF16 enabled for this file alone (CMakeLists.txt); the driver calls them
// only on CPUs that run them. Nothing here instantiates a library template (no std::vector, no
// <algorithm>): a weak copy compiled with AVX-512 could be picked by the linker for the rest of
// an AVX2 build. Scratch comes from the caller.
//
// vdpbf16ps multiplies pairs along the depth: acc[n] += a[2i] b[2i][n] + a[2i+1] b[2i+1][n]. So
// every B operand is packed as 32-bit words holding two depth steps of one column:
//   row pairs  X2[p][d] = (X[2p][d], X[2p+1][d])  for V, dY, Q, K as B of Y += P V, dV += P^T dY,
//                                                  dK += dS^T Q and dQ += dS K;
//   transposed Xt[p][s] = (X[s][2p], X[s][2p+1])  for K and V as B of S = Q K^T and dP = dY V^T.
// A row's own bf16 elements are already pairs along the depth (Q, dY, P and dS as A); the
// transposed A of dV and dK is P and dS in row-pair form. Tiles start on even rows, so a pair
// never straddles two tiles; the odd row a pair may add is padding whose weight is 0.
// Rounding: P (forward after the exp, backward the normalised P for dV) and dS (before the scale,
// which is applied to the fp32 sums as the eager GEMMs' alpha is) with vcvtneps2bf16, nearest
// even (fp32 denormals become 0, far below what a probability contributes); dY once, in packing.
#if defined(__AVX512BF16__)
#include <cmath>

#include "fusion/ops/attention_backward_rows_bf16.h"
#include "fusion/ops/attention_tile_dot_bf16.h"
#include "fusion/ops/flash_attention_bf16.h"
#include "kernels/online_softmax.h"

namespace ft::attention_bf16 {
namespace {

using backward_rows::add_scaled;
using backward_rows::pack_query;
using backward_rows::pair_weights;
using backward_rows::round_dy;
using backward_rows::WeightRow;
using tile::dot_row_block;
using tile::exp_lanes;
using tile::greater;
using tile::kAll;
using tile::kLanes;
using tile::kRowBlock;
using tile::lesser;
using tile::pack_row_pairs;
using tile::pack_rows;
using tile::pack_transposed;
using tile::reduce_lanes;
using tile::round_up;
using tile::word;

constexpr float kMasked = -INFINITY;

// Carves 64-byte aligned arrays out of the caller's scratch; with a null base it only counts.
class Arena {
 public:
  explicit Arena(unsigned char* base) : base_(base) {}
  template <typename T>
  T* take(int64_t count) {
    used_ = round_up(used_, 64);
    T* at = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + used_);
    used_ += count * static_cast<int64_t>(sizeof(T));
    return at;
  }
  int64_t used() const { return used_ + 64; }  // the caller's base may sit up to 63 bytes early

 private:
  unsigned char* base_;
  int64_t used_ = 0;
};

unsigned char* aligned(unsigned char* scratch) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(scratch);
  return scratch + (round_up(static_cast<int64_t>(at), 64) - static_cast<int64_t>(at));
}

// As flash_attention.cpp's TilePair: query rows [i0, i0 + rows) against keys [j0, j0 + keys).
struct TilePair {
  int64_t i0, rows, j0, keys;
  int64_t visible(int64_t r) const { return lesser(keys, i0 + r + 1 - j0); }
};

// Rows [begin, end) of a tile pair's query rows.
struct RowRange {
  int64_t begin, end;
};

// out[r][s] = <a row r, b column s> over `depth` words, for the columns each row block sees; a's
// rows lie lda words apart. Inlined into forward_head: its out-of-line call measured ~4% slower.
inline __attribute__((always_inline)) void causal_scores(float* out, int64_t ld, const word* a,
                                                         int64_t lda, int64_t depth, const word* bt,
                                                         int64_t ldb, const TilePair& pair,
                                                         const RowRange& range) {
  for (int64_t r0 = range.begin; r0 < range.end; r0 += kRowBlock) {
    const int64_t block_rows = lesser(int64_t{kRowBlock}, range.end - r0);
    const int64_t columns = round_up(pair.visible(r0 + block_rows - 1), kLanes);
    dot_row_block<false>(out + r0 * ld, ld, a + r0 * lda, lda, bt, ldb, block_rows, columns, 0,
                         depth, false);
  }
}

// How causal_mix stores its sums: added to out; written over it (a row's first key tile); or
// written over it, row r times row_scale[r] (Y / l straight from the registers, into an fp32 or
// a bf16 Y).
enum class MixStore { kAdd, kWrite, kWriteScaled };

// out[r][.] += sum_{s visible to r} weights[r][s] rows[s][.]  (Y += P V, dQ += dS K); weights
// rows are bf16, `lda` words apart; row_pairs is the key tile's row-pair form. row_scale (for
// kWriteScaled) is indexed as out's rows.
template <MixStore kStore = MixStore::kAdd, typename Out = float>
void causal_mix(Out* out, int64_t ldo, const word* weights, int64_t lda, const word* row_pairs,
                int64_t width, const TilePair& pair, const RowRange& range,
                const float* row_scale = nullptr) {
  constexpr bool kScaled = kStore == MixStore::kWriteScaled;
  for (int64_t r0 = range.begin; r0 < range.end; r0 += kRowBlock) {
    const int64_t block_rows = lesser(int64_t{kRowBlock}, range.end - r0);
    const int64_t pairs = (pair.visible(r0 + block_rows - 1) + 1) / 2;
    dot_row_block<false, kScaled>(out + r0 * ldo, ldo, weights + r0 * lda, lda, row_pairs, width,
                                  block_rows, width, 0, pairs, kStore == MixStore::kAdd,
                                  kScaled ? row_scale + r0 : nullptr);
  }
}

// out[s][.] += sum_{r that sees s} weights[r][s] rows[r][.]  (dV += P^T dY, dK += dS^T Q);
// weight_pairs[p][s] = (weights[2p][s], weights[2p+1][s]), ld words apart. A key block starting
// at s0 skips the rows before j0 + s0 - i0, from the pair that holds it.
void causal_mix_transposed(float* out, int64_t ldo, const word* weight_pairs, int64_t ld,
                           const word* row_pairs, int64_t width, const TilePair& pair) {
  for (int64_t s0 = 0; s0 < pair.keys; s0 += kRowBlock) {
    const int64_t block_keys = lesser(int64_t{kRowBlock}, pair.keys - s0);
    const int64_t first_row = greater(0, pair.j0 + s0 - pair.i0);
    dot_row_block<true>(out + s0 * ldo, ldo, weight_pairs + s0, ld, row_pairs, width, block_keys,
                        width, first_row / 2, (pair.rows + 1) / 2, true);
  }
}

// Columns of a weight row (P or dS) of a key tile of `keys` that the products read when the row
// sees `count` keys: its row block's last row sees up to kRowBlock - 1 more keys (Y += P V,
// dQ += dS K), and the transposed products read key blocks of kRowBlock from the row pair's
// first row on (dV += P^T dY, dK += dS^T Q). Past count they hold zeros; the rest of the row is
// never read, so neither filled nor rounded.
int64_t read_extent(int64_t count, int64_t keys) {
  return lesser(round_up(keys, kLanes), round_up(count + 2 * kRowBlock, kLanes));
}

void fill(float* row, int64_t begin, int64_t end, float value) {
  for (int64_t s = begin; s < end; ++s) row[s] = value;
}

// The packed copies of one head and the tile buffers, carved from a thread's scratch.
struct HeadBuffers {
  bf16_bits *q_rows, *dy_rows;                   // [T][width]
  word *kt, *vt;                                 // [width / 2][head_ld], transposed
  word *q_pairs, *k_pairs, *v_pairs, *dy_pairs;  // [T / 2][width], row pairs
  float *probs, *dscores;                        // [tile_rows][ld] fp32 tiles
  bf16_bits *probs_bf16, *dscores_bf16;          // [tile_rows][ld] rounded rows
  word *probs_pairs, *dscores_pairs;             // [tile_rows / 2][ld] rounded row pairs
  float *out, *dk_sum, *dv_sum;                  // [tile_rows][width]
  float *dq_sum, *dot_dy_y;                      // [T][width], [T]
  float* inv_sums;                               // [tile_rows]: 1 / l of forward's rows
  OnlineSoftmax* row_state;                      // [tile_rows]
};

HeadBuffers carve(Arena& arena, const HeadGeometry& g) {
  const int64_t T = g.seq_len, pairs = (T + 1) / 2, tile_cells = g.tile_rows * g.ld;
  HeadBuffers buffers;
  buffers.q_rows = arena.take<bf16_bits>(T * g.width);
  buffers.dy_rows = arena.take<bf16_bits>(T * g.width);
  buffers.kt = arena.take<word>(g.width / 2 * g.head_ld);
  buffers.vt = arena.take<word>(g.width / 2 * g.head_ld);
  buffers.q_pairs = arena.take<word>(pairs * g.width);
  buffers.k_pairs = arena.take<word>(pairs * g.width);
  buffers.v_pairs = arena.take<word>(pairs * g.width);
  buffers.dy_pairs = arena.take<word>(pairs * g.width);
  buffers.probs = arena.take<float>(tile_cells);
  buffers.dscores = arena.take<float>(tile_cells);
  buffers.probs_bf16 = arena.take<bf16_bits>(tile_cells);
  buffers.dscores_bf16 = arena.take<bf16_bits>(tile_cells);
  buffers.probs_pairs = arena.take<word>(tile_cells / 2);
  buffers.dscores_pairs = arena.take<word>(tile_cells / 2);
  buffers.out = arena.take<float>(g.tile_rows * g.width);
  buffers.dk_sum = arena.take<float>(g.tile_rows * g.width);
  buffers.dv_sum = arena.take<float>(g.tile_rows * g.width);
  buffers.dq_sum = arena.take<float>(T * g.width);
  buffers.dot_dy_y = arena.take<float>(T);
  buffers.inv_sums = arena.take<float>(g.tile_rows);
  buffers.row_state = arena.take<OnlineSoftmax>(g.tile_rows);
  return buffers;
}

}  // namespace

int64_t scratch_bytes(const HeadGeometry& geometry) {
  Arena counter(nullptr);
  carve(counter, geometry);
  return counter.used();
}

namespace {

// One unscaled score row of a key tile (`count` of its keys visible) through the online softmax
// (flash_attention.cpp's forward), in two passes over its whole vectors held in L1: the scaled
// row's max, then the weights exp(scale S - m') rounded into `weights` and their sum; the
// invisible keys are masked in registers, never written. `out_row` is rescaled to the new max
// unless this is the row's first key tile (`first`), whose output the mix then writes afresh:
// there exp(-inf - m') = 0 would only zero an output that is not there yet, and cost a libm call.
void online_weights(bf16_bits* weights, float* out_row, OnlineSoftmax& state, const float* row,
                    int64_t width, int64_t count, int64_t keys, float scale, bool first) {
  const int64_t vectors = count > 0 ? (count + kLanes - 1) / kLanes : 0;
  const int64_t extent = read_extent(count, keys);
  // The last vector's visible lanes (count may be <= 0: a row before the key tile's first key).
  const int64_t tail_lanes = count - (vectors - 1) * kLanes;
  const __mmask16 last = vectors > 0 ? static_cast<__mmask16>((1u << tail_lanes) - 1) : 0;
  const __m512 scales = _mm512_set1_ps(scale);
  float tile_max = kMasked;
  if (vectors > 0) {
    __m512 maxima = _mm512_set1_ps(kMasked);
    for (int64_t v = 0; v + 1 < vectors; ++v)
      maxima = _mm512_maskz_max_ps(kAll, maxima,
                                   _mm512_mul_ps(_mm512_loadu_ps(row + v * kLanes), scales));
    const __m512 tail = _mm512_mul_ps(_mm512_loadu_ps(row + (vectors - 1) * kLanes), scales);
    tile_max = reduce_lanes<true>(_mm512_mask_max_ps(maxima, last, maxima, tail));
  }
  float rescale = 1.0f;
  if (first)
    state.max = tile_max;
  else
    rescale = online_softmax_rescale(state, tile_max);
  const __m512 new_max = _mm512_set1_ps(state.max);
  __m512 sums = _mm512_setzero_ps();
  for (int64_t v = 0; v < vectors; ++v) {
    // GCC contracts scale S - m' into one fma (fp-contract=fast): exp's argument is then the
    // exact one rounded once, where the widened path rounds scale S first.
    const __m512 scores = _mm512_mul_ps(_mm512_loadu_ps(row + v * kLanes), scales);
    __m512 e = exp_lanes(_mm512_sub_ps(scores, new_max));
    if (v + 1 == vectors) e = _mm512_maskz_mov_ps(last, e);
    sums = _mm512_add_ps(sums, e);
    const __m256bh rounded = _mm512_cvtneps_pbh(e);
    std::memcpy(weights + v * kLanes, &rounded, sizeof(rounded));
  }
  for (int64_t s = vectors * kLanes; s < extent; s += kLanes)
    std::memset(weights + s, 0, kLanes * sizeof(bf16_bits));
  const float piece_sum = reduce_lanes<false>(sums);
  state.sum = first ? piece_sum : state.sum * rescale + piece_sum;
  if (first) return;
#pragma omp simd
  for (int64_t d = 0; d < width; ++d) out_row[d] *= rescale;
}

void put(float& y, float value) {
  y = value;
}
void put(bf16_bits& y, float value) {
  y = float_to_bf16(value);
}

// forward_head for an fp32 or a bf16 Y (Y / l rounded once, as the cast op after an fp32 Y does).
template <typename Out>
void forward_head_into(Out* y, float* lse, const bf16_bits* q, const bf16_bits* k,
                       const bf16_bits* v, const AttentionStrides& strides, const HeadGeometry& g,
                       unsigned char* scratch) {
  Arena arena(aligned(scratch));
  const HeadBuffers b = carve(arena, g);
  const int64_t T = g.seq_len, width = g.width, words = width / 2, ld = g.ld;
  // Q is the A of S = Q K^T, read a word per row and step: where its rows are whole words and
  // vectors it is read where it lies, as a copy (its rows a line apart in the activation) cost
  // more than the reads it saved.
  const bool q_in_place =
      g.hd == width && strides.q % 2 == 0 && reinterpret_cast<uintptr_t>(q) % alignof(word) == 0;
  if (!q_in_place) pack_rows(b.q_rows, q, strides.q, T, g.hd, width);
  pack_transposed(b.kt, g.head_ld, k, strides.k, T, g.hd, width);
  pack_row_pairs(b.v_pairs, v, strides.v, T, g.hd, width);
  const word* q_words = reinterpret_cast<const word*>(q_in_place ? q : b.q_rows);
  const int64_t q_ld = q_in_place ? strides.q / 2 : words;
  const word* probs_words = reinterpret_cast<const word*>(b.probs_bf16);
  for (int64_t i0 = 0; i0 < T; i0 += g.tile_rows) {
    const int64_t rows = lesser(i0 + g.tile_rows, T) - i0;
    // Where one key tile holds every key the rows see (gpt_small: T <= tile), a row block's l is
    // final after its weights: the mix then writes Y / l into y from its registers, whole vectors
    // of the head's row (so only where hd fills them), with no pass over an output tile.
    const bool direct = i0 + rows <= g.tile_rows && g.hd == width;
    for (int64_t r = 0; r < rows; ++r) b.row_state[r] = OnlineSoftmax{};
    for (int64_t j0 = 0; j0 < i0 + rows; j0 += g.tile_rows) {
      const TilePair pair{i0, rows, j0, lesser(j0 + g.tile_rows, T) - j0};
      const word* v_pairs = b.v_pairs + j0 / 2 * width;
      // A row block at a time, scores to output, so that its rows of the tile stay in L1.
      for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
        const RowRange block{r0, lesser(r0 + kRowBlock, rows)};
        causal_scores(b.probs, ld, q_words + i0 * q_ld, q_ld, words, b.kt + j0, g.head_ld, pair,
                      block);
        for (int64_t r = block.begin; r < block.end; ++r)
          online_weights(b.probs_bf16 + r * ld, b.out + r * width, b.row_state[r], b.probs + r * ld,
                         width, pair.visible(r), pair.keys, g.scale, j0 == 0);
        if (!direct) {
          if (j0 == 0)
            causal_mix<MixStore::kWrite>(b.out, width, probs_words, ld / 2, v_pairs, width, pair,
                                         block);
          else
            causal_mix(b.out, width, probs_words, ld / 2, v_pairs, width, pair, block);
          continue;
        }
        for (int64_t r = block.begin; r < block.end; ++r) {
          b.inv_sums[r] = 1.0f / b.row_state[r].sum;
          lse[i0 + r] = online_softmax_log_sum_exp(b.row_state[r]);
        }
        causal_mix<MixStore::kWriteScaled>(y + i0 * strides.y, strides.y, probs_words, ld / 2,
                                           v_pairs, width, pair, block, b.inv_sums);
      }
    }
    if (direct) continue;
    for (int64_t r = 0; r < rows; ++r) {
      const float inv_sum = 1.0f / b.row_state[r].sum;
      const float* out_row = b.out + r * width;
      Out* y_row = y + (i0 + r) * strides.y;
#pragma omp simd
      for (int64_t d = 0; d < g.hd; ++d) put(y_row[d], out_row[d] * inv_sum);
      lse[i0 + r] = online_softmax_log_sum_exp(b.row_state[r]);
    }
  }
}

// backward_head for the Y forward wrote, fp32 or bf16 (D = <dY, Y> on the Y the GEMMs saw).
template <typename Y>
void backward_head_from(float* dq, float* dk, float* dv, const float* dy, const Y* y,
                        const float* lse, const bf16_bits* q, const bf16_bits* k,
                        const bf16_bits* v, const AttentionStrides& strides, const HeadGeometry& g,
                        const AttentionGradWrites& writes, unsigned char* scratch) {
  Arena arena(aligned(scratch));
  const HeadBuffers b = carve(arena, g);
  const int64_t T = g.seq_len, hd = g.hd, width = g.width, words = width / 2, ld = g.ld;
  const float scale = g.scale;
  pack_query(b.q_rows, b.q_pairs, q, k, v, strides, T, hd, width);
  pack_transposed(b.kt, g.head_ld, k, strides.k, T, hd, width);
  pack_row_pairs(b.k_pairs, k, strides.k, T, hd, width);
  pack_transposed(b.vt, g.head_ld, v, strides.v, T, hd, width);
  // dY rounded once, as the eager chain's bf16_gradient_copy; D_t = <dY_t, Y_t> on that dY (see
  // flash_attention.cpp's backward for why one dot per row replaces sum_s P_ts dP_ts).
  round_dy(b.dy_rows, b.dy_pairs, b.dot_dy_y, dy, y, strides.y, T, hd, width);
  fill(b.dq_sum, 0, T * width, 0.0f);
  const word* q_words = reinterpret_cast<const word*>(b.q_rows);
  const word* dy_words = reinterpret_cast<const word*>(b.dy_rows);
  const word* dscores_words = reinterpret_cast<const word*>(b.dscores_bf16);
  for (int64_t j0 = 0; j0 < T; j0 += g.tile_rows) {
    const int64_t keys = lesser(j0 + g.tile_rows, T) - j0;
    fill(b.dk_sum, 0, keys * width, 0.0f);
    fill(b.dv_sum, 0, keys * width, 0.0f);
    for (int64_t i0 = j0; i0 < T; i0 += g.tile_rows) {
      const TilePair pair{i0, lesser(i0 + g.tile_rows, T) - i0, j0, keys};
      // P = exp(scale Q K^T - L), dP = dY V^T, dS = P (dP - D) unscaled (the scale multiplies
      // the fp32 sums of dQ and dK), so that dV += P^T dY, dK += dS^T Q, dQ += dS K. A row
      // block at a time up to dQ, so that its fp32 S and dP rows (the tiles' first kRowBlock
      // rows) stay in L1; dV and dK take every row pair's P and dS after the last block.
      for (int64_t r0 = 0; r0 < pair.rows; r0 += kRowBlock) {
        const RowRange block{r0, lesser(r0 + kRowBlock, pair.rows)};
        const int64_t block_rows = block.end - r0;
        const int64_t columns = round_up(pair.visible(block.end - 1), kLanes);
        dot_row_block<false>(b.probs, ld, q_words + (i0 + r0) * words, words, b.kt + j0, g.head_ld,
                             block_rows, columns, 0, words, false);
        dot_row_block<false>(b.dscores, ld, dy_words + (i0 + r0) * words, words, b.vt + j0,
                             g.head_ld, block_rows, columns, 0, words, false);
        for (int64_t r = r0; r < block.end; r += 2) {
          const int64_t at = (r - r0) * ld;
          const WeightRow even{b.probs + at, b.dscores + at, pair.visible(r), lse[i0 + r],
                               b.dot_dy_y[i0 + r]};
          // A last, unpaired row pairs with a row that sees nothing (read from the even row).
          const bool paired = r + 1 < pair.rows;
          const WeightRow odd =
              paired ? WeightRow{b.probs + at + ld, b.dscores + at + ld, pair.visible(r + 1),
                                 lse[i0 + r + 1], b.dot_dy_y[i0 + r + 1]}
                     : WeightRow{even.scores, even.dprobs, 0, 0.0f, 0.0f};
          // The even row's extent: the odd row sees one key more, and zeros up to its own.
          bf16_bits* ds_rounded = b.dscores_bf16 + r * ld;
          pair_weights(b.probs_pairs + r / 2 * ld, b.dscores_pairs + r / 2 * ld, ds_rounded,
                       ds_rounded + ld, even, odd, read_extent(even.count, keys), scale);
        }
        causal_mix(b.dq_sum + i0 * width, width, dscores_words, ld / 2, b.k_pairs + j0 / 2 * width,
                   width, pair, block);
      }
      causal_mix_transposed(b.dv_sum, width, b.probs_pairs, ld, b.dy_pairs + i0 / 2 * width, width,
                            pair);
      causal_mix_transposed(b.dk_sum, width, b.dscores_pairs, ld, b.q_pairs + i0 / 2 * width, width,
                            pair);
    }
    // A key tile's dK and dV are whole here (every query tile added in), dQ after the last one.
    add_scaled(dk + j0 * strides.k, strides.k, b.dk_sum, width, keys, hd, scale, writes.dk);
    add_scaled(dv + j0 * strides.v, strides.v, b.dv_sum, width, keys, hd, 1.0f, writes.dv);
  }
  add_scaled(dq, strides.q, b.dq_sum, width, T, hd, scale, writes.dq);
  _mm_sfence();  // streamed rows are weakly ordered: make them visible before another thread reads
}

}  // namespace

void forward_head(float* y, float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                  const AttentionStrides& strides, const HeadGeometry& g, unsigned char* scratch) {
  forward_head_into(y, lse, q, k, v, strides, g, scratch);
}
void forward_head(bf16_bits* y, float* lse, const bf16_bits* q, const bf16_bits* k,
                  const bf16_bits* v, const AttentionStrides& strides, const HeadGeometry& g,
                  unsigned char* scratch) {
  forward_head_into(y, lse, q, k, v, strides, g, scratch);
}

void backward_head(float* dq, float* dk, float* dv, const float* dy, const float* y,
                   const float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                   const AttentionStrides& strides, const HeadGeometry& g,
                   const AttentionGradWrites& writes, unsigned char* scratch) {
  backward_head_from(dq, dk, dv, dy, y, lse, q, k, v, strides, g, writes, scratch);
}
void backward_head(float* dq, float* dk, float* dv, const float* dy, const bf16_bits* y,
                   const float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                   const AttentionStrides& strides, const HeadGeometry& g,
                   const AttentionGradWrites& writes, unsigned char* scratch) {
  backward_head_from(dq, dk, dv, dy, y, lse, q, k, v, strides, g, writes, scratch);
}

}  // namespace ft::attention_bf16
#endif  // __AVX512BF16__
