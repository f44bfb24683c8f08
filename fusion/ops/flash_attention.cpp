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
#include "core/math/fast_exp.h"
#include "core/math/online_softmax.h"
#include "model/ops/attention_heads.h"
#include "model/ops/op_checks.h"

namespace ft {
namespace {

// Keys per register block of a score row: four 8-float accumulators on AVX2.
constexpr int64_t kKeyBlock = 32;

// kt[d * ld + s] = k_rows[s][d] for the n rows of one key tile.
void pack_transposed(float* kt, const float* k_rows, int64_t stride, int64_t n, int64_t hd,
                     int64_t ld) {
  for (int64_t s = 0; s < n; ++s)
    for (int64_t d = 0; d < hd; ++d) kt[d * ld + s] = k_rows[s * stride + d];
}

// scores[s] = sum_d q_scaled[d] kt[d][s] for s < count, in blocks of kKeyBlock keys kept in
// registers across the d loop. REQUIRES: scores and every kt row hold count rounded up to
// kKeyBlock floats (the tail of the last block is computed from padding and ignored).
void score_row(float* scores, const float* q_scaled, const float* kt, int64_t count, int64_t hd,
               int64_t ld) {
  for (int64_t s0 = 0; s0 < count; s0 += kKeyBlock) {
    float acc[kKeyBlock] = {};
    for (int64_t d = 0; d < hd; ++d) {
      const float qd = q_scaled[d];
      const float* kt_row = kt + d * ld + s0;
#pragma omp simd
      for (int64_t s = 0; s < kKeyBlock; ++s) acc[s] += qd * kt_row[s];
    }
    std::copy(acc, acc + kKeyBlock, scores + s0);
  }
}

// out[d] += sum_{s < count} weights[s] rows[s * stride + d] for d < hd. With the head width a
// constant the row stays in registers, split over two accumulators to halve the FMA chain.
template <int kHd>
void accumulate_rows(float* out, const float* weights, const float* rows, int64_t stride,
                     int64_t count, int64_t) {
  float even[kHd], odd[kHd];
#pragma omp simd
  for (int d = 0; d < kHd; ++d) even[d] = out[d], odd[d] = 0.0f;
  int64_t s = 0;
  for (; s + 1 < count; s += 2) {
    const float w0 = weights[s], w1 = weights[s + 1];
    const float* row0 = rows + s * stride;
    const float* row1 = row0 + stride;
#pragma omp simd
    for (int d = 0; d < kHd; ++d) {
      even[d] += w0 * row0[d];
      odd[d] += w1 * row1[d];
    }
  }
  if (s < count) {
    const float w = weights[s];
    const float* row = rows + s * stride;
#pragma omp simd
    for (int d = 0; d < kHd; ++d) even[d] += w * row[d];
  }
#pragma omp simd
  for (int d = 0; d < kHd; ++d) out[d] = even[d] + odd[d];
}

void accumulate_rows_any(float* out, const float* weights, const float* rows, int64_t stride,
                         int64_t count, int64_t hd) {
  for (int64_t s = 0; s < count; ++s) {
    const float w = weights[s];
    const float* row = rows + s * stride;
#pragma omp simd
    for (int64_t d = 0; d < hd; ++d) out[d] += w * row[d];
  }
}

using AccumulateRowsFn = void (*)(float*, const float*, const float*, int64_t, int64_t, int64_t);
AccumulateRowsFn accumulate_rows_for(int64_t hd) {
  switch (hd) {
    case 16:
      return accumulate_rows<16>;
    case 32:
      return accumulate_rows<32>;
    case 64:
      return accumulate_rows<64>;
    default:
      return accumulate_rows_any;
  }
}

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace

void flash_attention_forward(float* y, float* lse, const float* q, const float* k, const float* v,
                             const AttentionStrides& strides, int batch, int seq_len, int channels,
                             int n_head, int tile) {
  const int64_t T = seq_len, hd = channels / n_head, heads = static_cast<int64_t>(batch) * n_head;
  const int64_t tile_rows = std::min<int64_t>(tile, T), ld = round_up(tile_rows, kKeyBlock);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const AccumulateRowsFn accumulate = accumulate_rows_for(hd);
#pragma omp parallel if (heads > 1)
  {
    std::vector<float> kt(hd * ld), scores(ld), q_scaled(hd);
    std::vector<float> out(tile_rows * hd);
    std::vector<OnlineSoftmax> row_state(tile_rows);
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / n_head, h = bh % n_head;
      const float* qh = q + b * T * strides.q + h * hd;
      const float* kh = k + b * T * strides.k + h * hd;
      const float* vh = v + b * T * strides.v + h * hd;
      float* yh = y + b * T * strides.y + h * hd;
      for (int64_t i0 = 0; i0 < T; i0 += tile_rows) {
        const int64_t i1 = std::min(i0 + tile_rows, T);
        std::fill(row_state.begin(), row_state.end(), OnlineSoftmax{});
        std::fill(out.begin(), out.end(), 0.0f);
        // Causal: key tiles starting after the query tile's last row contribute nothing.
        for (int64_t j0 = 0; j0 < i1; j0 += tile_rows) {
          const int64_t j1 = std::min(j0 + tile_rows, T);
          pack_transposed(kt.data(), kh + j0 * strides.k, strides.k, j1 - j0, hd, ld);
          for (int64_t t = std::max(i0, j0); t < i1; ++t) {
            const int64_t r = t - i0, count = std::min(j1, t + 1) - j0;
            const float* q_row = qh + t * strides.q;
#pragma omp simd
            for (int64_t d = 0; d < hd; ++d) q_scaled[d] = scale * q_row[d];
            score_row(scores.data(), q_scaled.data(), kt.data(), count, hd, ld);
            // A select, not std::max, so the reduction vectorises.
            float tile_max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : tile_max)
            for (int64_t s = 0; s < count; ++s)
              tile_max = scores[s] > tile_max ? scores[s] : tile_max;
            // Online softmax (core/math/online_softmax.h): with m' = max(m, tile max), the
            // earlier terms of l and of the output were weighted by exp(S - m) and are rescaled
            // by exp(m - m').
            OnlineSoftmax& state = row_state[r];
            const float rescale = online_softmax_rescale(state, tile_max);
            const float new_max = state.max;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t s = 0; s < count; ++s) {
              scores[s] = online_softmax_weight(scores[s], new_max);
              sum += scores[s];
            }
            online_softmax_accumulate(state, rescale, sum);
            float* out_row = out.data() + r * hd;
#pragma omp simd
            for (int64_t d = 0; d < hd; ++d) out_row[d] *= rescale;
            accumulate(out_row, scores.data(), vh + j0 * strides.v, strides.v, count, hd);
          }
        }
        for (int64_t t = i0; t < i1; ++t) {
          const int64_t r = t - i0;
          const float inv_sum = 1.0f / row_state[r].sum;
          const float* out_row = out.data() + r * hd;
          float* y_row = yh + t * strides.y;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) y_row[d] = out_row[d] * inv_sum;
          lse[bh * T + t] = online_softmax_log_sum_exp(row_state[r]);
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
  const int64_t tile_rows = std::min<int64_t>(tile, T), ld = round_up(tile_rows, kKeyBlock);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const AccumulateRowsFn accumulate = accumulate_rows_for(hd);
#pragma omp parallel if (heads > 1)
  {
    std::vector<float> kt(hd * ld), vt(hd * ld), q_scaled(hd), dot_dy_y(T);
    std::vector<float> probs(ld), dprobs(ld), probs1(ld), dprobs1(ld);
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
        pack_transposed(kt.data(), k + k_at + j0 * strides.k, strides.k, j1 - j0, hd, ld);
        pack_transposed(vt.data(), v + v_at + j0 * strides.v, strides.v, j1 - j0, hd, ld);
        std::fill(dk_tile.begin(), dk_tile.end(), 0.0f);
        std::fill(dv_tile.begin(), dv_tile.end(), 0.0f);
        // Row t's probabilities P_t. and dS_t. over this key tile (the scale of S folded into
        // dS), and its dQ_t; returns how many of the tile's keys it sees.
        auto row_gradients = [&](int64_t t, float* row_probs, float* row_dscores) {
          const int64_t count = std::min(j1, t + 1) - j0;
          const float* q_row = q + q_at + t * strides.q;
#pragma omp simd
          for (int64_t d = 0; d < hd; ++d) q_scaled[d] = scale * q_row[d];
          // P_ts = exp(S_ts - L_t), exactly the forward's normalised probabilities.
          score_row(row_probs, q_scaled.data(), kt.data(), count, hd, ld);
          const float row_lse = lse_h[t];
#pragma omp simd
          for (int64_t s = 0; s < count; ++s) row_probs[s] = fast_exp(row_probs[s] - row_lse);
          // dP_ts = <dY_t, V_s>;  dS_ts = P_ts (dP_ts - D_t)
          score_row(row_dscores, dy + y_at + t * strides.y, vt.data(), count, hd, ld);
          const float row_dot = dot_dy_y[t];
#pragma omp simd
          for (int64_t s = 0; s < count; ++s)
            row_dscores[s] = scale * row_probs[s] * (row_dscores[s] - row_dot);
          // dQ_t += sum_s dS_ts K_s
          accumulate(dq + q_at + t * strides.q, row_dscores, k + k_at + j0 * strides.k, strides.k,
                     count, hd);
          return count;
        };
        // Causal: query rows before the tile's first key see none of it. Rows go in pairs so
        // each dV_s and dK_s row is loaded and stored once per two query rows.
        for (int64_t t = j0; t < T; t += 2) {
          const int64_t count0 = row_gradients(t, probs.data(), dprobs.data());
          const bool pair = t + 1 < T;
          const int64_t count1 = pair ? row_gradients(t + 1, probs1.data(), dprobs1.data()) : 0;
          if (!pair) {
            std::fill(probs1.begin(), probs1.begin() + count0, 0.0f);
            std::fill(dprobs1.begin(), dprobs1.begin() + count0, 0.0f);
          }
          const int64_t t1 = pair ? t + 1 : t;
          const float* q0 = q + q_at + t * strides.q;
          const float* q1 = q + q_at + t1 * strides.q;
          const float* dy0 = dy + y_at + t * strides.y;
          const float* dy1 = dy + y_at + t1 * strides.y;
          // dV_s += P_ts dY_t;  dK_s += dS_ts Q_t   (row t + 1 sees at most one key more)
          for (int64_t s = 0; s < std::max(count0, count1); ++s) {
            const float p0 = s < count0 ? probs[s] : 0.0f, ds0 = s < count0 ? dprobs[s] : 0.0f;
            const float p1 = probs1[s], ds1 = dprobs1[s];
            float* dv_row = dv_tile.data() + s * hd;
            float* dk_row = dk_tile.data() + s * hd;
#pragma omp simd
            for (int64_t d = 0; d < hd; ++d) {
              dv_row[d] += p0 * dy0[d] + p1 * dy1[d];
              dk_row[d] += ds0 * q0[d] + ds1 * q1[d];
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

float* FlashAttentionOp::delta_scratch(Device device) {
  if (delta_.numel() != lse_.numel() || delta_.device() != device)
    delta_ = Tensor::empty({batch_, n_head_, seq_len_}, device);
  return delta_.data();
}

void FlashAttentionOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  const int64_t lse_numel = static_cast<int64_t>(batch_) * n_head_ * seq_len_;
  if (lse_.numel() != lse_numel || lse_.device() != ws.device)
    lse_ = Tensor::empty({batch_, n_head_, seq_len_}, ws.device);
  FT_RUN_ON_CUDA(ws, flash_attention_forward_cuda(
                         ws.values[outputs[0]].data(), lse_.data(), ws.values[inputs[0]].data(),
                         ws.values[inputs[1]].data(), ws.values[inputs[2]].data(), strides(ws),
                         batch_, seq_len_, channels_, n_head_, ws.stream));
  flash_attention_forward(ws.values[outputs[0]].data(), lse_.data(), ws.values[inputs[0]].data(),
                          ws.values[inputs[1]].data(), ws.values[inputs[2]].data(), strides(ws),
                          batch_, seq_len_, channels_, n_head_, tile_);
}

void FlashAttentionOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_CHECK(lse_.numel() == static_cast<int64_t>(batch_) * n_head_ * seq_len_ &&
               lse_.device() == ws.device,
           kind(), " '", name, "': backward before forward");
  // The kernel accumulates; a fresh gradient is always a root (views are never handed out
  // fresh), so zeroing it whole here is the overwrite, at B*T*C floats against O(T^2) work.
  for (ValueId id : inputs)
    if (ws.grad_is_fresh(id)) ws.grads[id].fill(0.0f);
  FT_RUN_ON_CUDA(
      ws, flash_attention_backward_cuda(
              ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(), ws.grads[inputs[2]].data(),
              delta_scratch(ws.device), ws.grads[outputs[0]].data(), ws.values[outputs[0]].data(),
              lse_.data(), ws.values[inputs[0]].data(), ws.values[inputs[1]].data(),
              ws.values[inputs[2]].data(), strides(ws), batch_, seq_len_, channels_, n_head_,
              ws.stream));
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
