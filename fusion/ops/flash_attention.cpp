// Fused causal attention (see flash_attention.h). One OpenMP task per (b, h); inside it every
// loop over the tile's keys (s) or the head's channels (d) is a simd loop. Key tiles are packed
// transposed, kt[d][s], so a score row is hd axpys over contiguous keys; value and key rows are
// read in place (hd contiguous floats of a strided row).
#include "fusion/ops/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "model/ops/attention_heads.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

// kt[d * tile + s] = k_rows[s][d] for the n rows of one key tile.
void pack_transposed(float* kt, const float* k_rows, int64_t stride, int64_t n, int64_t hd,
                     int64_t tile) {
  for (int64_t s = 0; s < n; ++s)
    for (int64_t d = 0; d < hd; ++d) kt[d * tile + s] = k_rows[s * stride + d];
}

// scores[s] = sum_d q_scaled[d] kt[d][s] for s < count.
void score_row(float* scores, const float* q_scaled, const float* kt, int64_t count, int64_t hd,
               int64_t tile) {
  std::fill(scores, scores + count, 0.0f);
  for (int64_t d = 0; d < hd; ++d) {
    const float qd = q_scaled[d];
    const float* kt_row = kt + d * tile;
#pragma omp simd
    for (int64_t s = 0; s < count; ++s) scores[s] += qd * kt_row[s];
  }
}

}  // namespace

void flash_attention_forward(float* y, float* lse, const float* q, const float* k, const float* v,
                             const AttentionStrides& strides, int batch, int seq_len, int channels,
                             int n_head, int tile) {
  const int64_t T = seq_len, hd = channels / n_head, heads = static_cast<int64_t>(batch) * n_head;
  const int64_t tile_rows = std::min<int64_t>(tile, T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel if (heads > 1)
  {
    std::vector<float> kt(hd * tile_rows), scores(tile_rows), q_scaled(hd);
    std::vector<float> out(tile_rows * hd), row_max(tile_rows), row_sum(tile_rows);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / n_head, h = bh % n_head;
      const float* qh = q + b * T * strides.q + h * hd;
      const float* kh = k + b * T * strides.k + h * hd;
      const float* vh = v + b * T * strides.v + h * hd;
      float* yh = y + b * T * strides.y + h * hd;
      for (int64_t i0 = 0; i0 < T; i0 += tile_rows) {
        const int64_t i1 = std::min(i0 + tile_rows, T);
        std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<float>::infinity());
        std::fill(row_sum.begin(), row_sum.end(), 0.0f);
        std::fill(out.begin(), out.end(), 0.0f);
        // Causal: key tiles starting after the query tile's last row contribute nothing.
        for (int64_t j0 = 0; j0 < i1; j0 += tile_rows) {
          const int64_t j1 = std::min(j0 + tile_rows, T);
          pack_transposed(kt.data(), kh + j0 * strides.k, strides.k, j1 - j0, hd, tile_rows);
          for (int64_t t = std::max(i0, j0); t < i1; ++t) {
            const int64_t r = t - i0, count = std::min(j1, t + 1) - j0;
            const float* q_row = qh + t * strides.q;
#pragma omp simd
            for (int64_t d = 0; d < hd; ++d) q_scaled[d] = scale * q_row[d];
            score_row(scores.data(), q_scaled.data(), kt.data(), count, hd, tile_rows);
            float tile_max = scores[0];
#pragma omp simd reduction(max : tile_max)
            for (int64_t s = 1; s < count; ++s) tile_max = std::max(tile_max, scores[s]);
            // Online softmax: with m' = max(m, tile max), the earlier terms of l and of the
            // output were weighted by exp(S - m) and are rescaled by exp(m - m').
            const float new_max = std::max(row_max[r], tile_max);
            const float rescale = std::exp(row_max[r] - new_max);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t s = 0; s < count; ++s) {
              scores[s] = std::exp(scores[s] - new_max);
              sum += scores[s];
            }
            row_sum[r] = row_sum[r] * rescale + sum;
            row_max[r] = new_max;
            float* out_row = out.data() + r * hd;
#pragma omp simd
            for (int64_t d = 0; d < hd; ++d) out_row[d] *= rescale;
            for (int64_t s = 0; s < count; ++s) {
              const float p = scores[s];
              const float* v_row = vh + (j0 + s) * strides.v;
#pragma omp simd
              for (int64_t d = 0; d < hd; ++d) out_row[d] += p * v_row[d];
            }
          }
        }
        for (int64_t t = i0; t < i1; ++t) {
          const int64_t r = t - i0;
          const float inv_sum = 1.0f / row_sum[r];
          const float* out_row = out.data() + r * hd;
          float* y_row = yh + t * strides.y;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) y_row[d] = out_row[d] * inv_sum;
          lse[bh * T + t] = row_max[r] + std::log(row_sum[r]);
        }
      }
    }
  }
}

void flash_attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* y,
                              const float* lse, const float* q, const float* k, const float* v,
                              const AttentionStrides& strides, int batch, int seq_len, int channels,
                              int n_head, int tile) {
  const int64_t T = seq_len, hd = channels / n_head, heads = static_cast<int64_t>(batch) * n_head;
  const int64_t tile_rows = std::min<int64_t>(tile, T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
#pragma omp parallel if (heads > 1)
  {
    std::vector<float> kt(hd * tile_rows), vt(hd * tile_rows), q_scaled(hd), dot_dy_y(T);
    std::vector<float> probs(tile_rows), dprobs(tile_rows);
    std::vector<float> dk_tile(tile_rows * hd), dv_tile(tile_rows * hd);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / n_head, h = bh % n_head;
      const int64_t q_at = b * T * strides.q + h * hd, k_at = b * T * strides.k + h * hd;
      const int64_t v_at = b * T * strides.v + h * hd, y_at = b * T * strides.y + h * hd;
      const float* lse_h = lse + bh * T;
      // D_t = sum_s P_ts dP_ts = sum_s P_ts <dY_t, V_s> = <dY_t, Y_t>: one dot per row instead
      // of a second pass over the key tiles.
      for (int64_t t = 0; t < T; ++t) {
        const float* dy_row = dy + y_at + t * strides.y;
        const float* y_row = y + y_at + t * strides.y;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < hd; ++d) dot += dy_row[d] * y_row[d];
        dot_dy_y[t] = dot;
      }
      for (int64_t j0 = 0; j0 < T; j0 += tile_rows) {
        const int64_t j1 = std::min(j0 + tile_rows, T);
        pack_transposed(kt.data(), k + k_at + j0 * strides.k, strides.k, j1 - j0, hd, tile_rows);
        pack_transposed(vt.data(), v + v_at + j0 * strides.v, strides.v, j1 - j0, hd, tile_rows);
        std::fill(dk_tile.begin(), dk_tile.end(), 0.0f);
        std::fill(dv_tile.begin(), dv_tile.end(), 0.0f);
        // Causal: query rows before the tile's first key see none of it.
        for (int64_t t = j0; t < T; ++t) {
          const int64_t count = std::min(j1, t + 1) - j0;
          const float* q_row = q + q_at + t * strides.q;
          const float* dy_row = dy + y_at + t * strides.y;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) q_scaled[d] = scale * q_row[d];
          // P_ts = exp(S_ts - L_t), exactly the forward's normalised probabilities.
          score_row(probs.data(), q_scaled.data(), kt.data(), count, hd, tile_rows);
          const float row_lse = lse_h[t];
#pragma omp simd
          for (int64_t s = 0; s < count; ++s) probs[s] = std::exp(probs[s] - row_lse);
          // dP_ts = <dY_t, V_s>;  dS_ts = P_ts (dP_ts - D_t), with the scale of S folded in.
          score_row(dprobs.data(), dy_row, vt.data(), count, hd, tile_rows);
          const float row_dot = dot_dy_y[t];
#pragma omp simd
          for (int64_t s = 0; s < count; ++s) dprobs[s] = scale * probs[s] * (dprobs[s] - row_dot);
          float* dq_row = dq + q_at + t * strides.q;
          for (int64_t s = 0; s < count; ++s) {
            const float p = probs[s], ds = dprobs[s];
            const float* k_row = k + k_at + (j0 + s) * strides.k;
            float* dv_row = dv_tile.data() + s * hd;
            float* dk_row = dk_tile.data() + s * hd;
            // dV_s += P_ts dY_t;  dQ_t += dS_ts K_s;  dK_s += dS_ts Q_t
#pragma omp simd
            for (int64_t d = 0; d < hd; ++d) {
              dv_row[d] += p * dy_row[d];
              dq_row[d] += ds * k_row[d];
              dk_row[d] += ds * q_row[d];
            }
          }
        }
        for (int64_t s = 0; s < j1 - j0; ++s) {
          float* dk_row = dk + k_at + (j0 + s) * strides.k;
          float* dv_row = dv + v_at + (j0 + s) * strides.v;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) {
            dk_row[d] += dk_tile[s * hd + d];
            dv_row[d] += dv_tile[s * hd + d];
          }
        }
      }
    }
  }
}

FlashAttentionOp::FlashAttentionOp(int batch, int seq_len, int channels, int n_head, int tile)
    : batch_(batch), seq_len_(seq_len), channels_(channels), n_head_(n_head), tile_(tile) {
  check_attention_shape("FlashAttentionOp", batch, seq_len, channels, n_head);
  FT_CHECK(tile >= 1, "FlashAttentionOp: tile ", tile, " must be at least 1");
}

void FlashAttentionOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 3, 1, 0);
  const int64_t numel = static_cast<int64_t>(batch_) * seq_len_ * channels_;
  expect_numel(ws.values[inputs[0]], numel, *this, "input q");
  expect_numel(ws.values[inputs[1]], numel, *this, "input k");
  expect_numel(ws.values[inputs[2]], numel, *this, "input v");
  expect_numel(ws.values[outputs[0]], numel, *this, "output y");
}

AttentionStrides FlashAttentionOp::strides(const Workspace& ws) const {
  return {ws.row_stride(inputs[0]), ws.row_stride(inputs[1]), ws.row_stride(inputs[2]),
          ws.row_stride(outputs[0])};
}

void FlashAttentionOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  const int64_t lse_numel = static_cast<int64_t>(batch_) * n_head_ * seq_len_;
  if (lse_.numel() != lse_numel) lse_ = Tensor::empty({batch_, n_head_, seq_len_});
  flash_attention_forward(ws.values[outputs[0]].data(), lse_.data(), ws.values[inputs[0]].data(),
                          ws.values[inputs[1]].data(), ws.values[inputs[2]].data(), strides(ws),
                          batch_, seq_len_, channels_, n_head_, tile_);
}

void FlashAttentionOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_CHECK(lse_.numel() == static_cast<int64_t>(batch_) * n_head_ * seq_len_, kind(), " '", name,
           "': backward before forward");
  // The kernel accumulates; a fresh gradient is always a root (views are never handed out
  // fresh), so zeroing it whole here is the overwrite, at B*T*C floats against O(T^2) work.
  for (ValueId id : inputs)
    if (ws.grad_is_fresh(id)) ws.grads[id].fill(0.0f);
  flash_attention_backward(ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(),
                           ws.grads[inputs[2]].data(), ws.grads[outputs[0]].data(),
                           ws.values[outputs[0]].data(), lse_.data(), ws.values[inputs[0]].data(),
                           ws.values[inputs[1]].data(), ws.values[inputs[2]].data(), strides(ws),
                           batch_, seq_len_, channels_, n_head_, tile_);
}

OpCost FlashAttentionOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  // Only the causal half of the (t, s) pairs is computed (diagonal tiles included).
  const double pairs = static_cast<double>(batch_) * n_head_ * seq_len_ * (seq_len_ + 1) / 2;
  const double hd = channels_ / n_head_;
  cost.forward_flops = pairs * (4 * hd + 4);             // S = QK^T, Y += PV, online softmax
  cost.backward_flops = pairs * (10 * hd + 6);           // S again, dP, dV, dQ, dK, dS
  cost.saved_bytes = 4.0 * batch_ * n_head_ * seq_len_;  // the log-sum-exp
  return cost;
}

}  // namespace ft
