// Fused causal attention, FlashAttention-style, on the CPU: replaces the eager chain
// AttentionScoresOp -> CausalSoftmaxOp -> AttentionMixOp (model/ops/) by one op that never stores
// a T x T matrix.
//   y[b, t, head h] = sum_{s <= t} softmax_s(q_t · k_s / sqrt(hd)) v_s      (heads concatenated)
// Forward walks, per (b, h), query tiles x key tiles (tiles of `tile` rows; key tiles above the
// diagonal are skipped) with an online softmax: a running max m_t and sum l_t per query row, the
// partial output rescaled by exp(m_old - m_new) whenever the max grows. It saves only the
// log-sum-exp L_t = m_t + log l_t per row, [B, NH, T].
// Backward (FlashAttention-2) recomputes each score tile from q, k and L: P = exp(S - L), then
//   dV += P^T dY,  dP = dY V^T,  dS = P (dP - D) with D_t = rowsum(dY_t y_t) = <P_t, dP_t>,
//   dQ += scale dS K,  dK += scale dS^T Q.
// Inputs {q, k, v [B, T, C]} (any may be a column view; all fp32, or all bf16 and packed under
// train.precision: bf16, see flash_attention_op.cpp), outputs {y [B, T, C]} fp32 (may be a view),
// or bf16 where fusion.vertical.cast absorbed the cast after it: y is then rounded once from the
// fp32 Y / l, and backward's D = <dY, Y> is taken on the rounded Y (FlashAttention-2's choice on a
// bf16 output), which is where it differs from its twin, flash attention then the cast.
// On cuda (flash_attention.cu) the tiles are 32 x 32 whatever `tile` says, head_dim is at most
// 128, and backward needs no atomics: one kernel per key tile for dK, dV, one per query tile for
// dQ, so a step is reproducible bit for bit.
// Thread safety: an op instance belongs to one training thread; (b, h) pairs run on OpenMP.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "model/graph.h"

namespace ft {

// Row strides, in floats, of the four [B*T, C] activations (their gradients share them).
struct AttentionStrides {
  int64_t q = 0, k = 0, v = 0, y = 0;
};

// What the fp32 CPU kernels round to bf16 inside the tiles: nothing (fp32 precision), or, on q, k,
// v widened from bf16, what the bf16 kernels (flash_attention_bf16.h) and the eager twin round:
// P and dS before their products, dY once.
enum class TileRounding { kNone, kBf16 };

// Writes y and lse [B, NH, T]. REQUIRES: tile >= 1.
void flash_attention_forward(float* y, float* lse, const float* q, const float* k, const float* v,
                             const AttentionStrides& strides, int batch, int seq_len, int channels,
                             int n_head, int tile, TileRounding rounding = TileRounding::kNone);
// dq, dk, dv += their gradients, recomputing the probabilities from q, k and lse.
void flash_attention_backward(float* dq, float* dk, float* dv, const float* dy, const float* y,
                              const float* lse, const float* q, const float* k, const float* v,
                              const AttentionStrides& strides, int batch, int seq_len, int channels,
                              int n_head, int tile, TileRounding rounding = TileRounding::kNone);

// The same on device pointers, enqueued on `stream` (flash_attention.cu; CUDA builds only).
// `delta` is scratch for D_t, [B, NH, T]. REQUIRES: channels / n_head <= 128 (checked).
void flash_attention_forward_cuda(float* y, float* lse, const float* q, const float* k,
                                  const float* v, const AttentionStrides& strides, int batch,
                                  int seq_len, int channels, int n_head, CudaStream stream);
void flash_attention_backward_cuda(float* dq, float* dk, float* dv, float* delta, const float* dy,
                                   const float* y, const float* lse, const float* q, const float* k,
                                   const float* v, const AttentionStrides& strides, int batch,
                                   int seq_len, int channels, int n_head, CudaStream stream);

class FlashAttentionOp : public Op {
 public:
  // REQUIRES: tile >= 1 (tiles longer than seq_len are clamped to it).
  FlashAttentionOp(int batch, int seq_len, int channels, int n_head, int tile);
  OpKind op_kind() const override { return OpKind::kFlashAttention; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  // The bf16 tiles write each head's dq, dk and dv rows once, so they can take q, k and v's views
  // of one root (the QKV GEMM's) fresh: the root is then neither zeroed nor read back.
  bool overwrites_fresh_view_grads(const Workspace& ws) const override {
    return runs_bf16_tiles(ws);
  }
  bool supports_views() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int tile() const { return tile_; }
  // Log-sum-exp of every score row of the last forward, [B, NH, T].
  const Tensor& lse() const { return lse_; }

 private:
  void check_wiring(const Workspace& ws) const;
  AttentionStrides strides(const Workspace& ws) const;
  // q, k and v as the fp32 kernels read them: the values themselves, or (bf16 values) fp32 copies,
  // refreshed when `widen`.
  struct Operands {
    const float *q, *k, *v;
  };
  Operands operands(const Workspace& ws, bool widen);
  // Forward on fp32 operands `in` into the fp32 y: the CPU kernels, or cuda's.
  void forward_fp32_kernels(const Workspace& ws, float* y, const Operands& in);
  // Whether the bf16 tile kernels (flash_attention_bf16.h) run this op: bf16 operands on a CPU
  // that has them.
  bool runs_bf16_tiles(const Workspace& ws) const;
  // What the fp32 CPU kernels round: kBf16 for widened bf16 operands.
  TileRounding tile_rounding(const Workspace& ws) const;
  // The CUDA backward's D_t = <dY_t, Y_t>, [B, NH, T], allocated on `device` on first use.
  float* delta_scratch(Device device);
  // A bf16 y on the kernels that write fp32 (no bf16 tiles, or cuda): widened_y_, y's span in
  // fp32 at y's stride (widened_output allocates it), which forward writes and rounds into y
  // (round_output), and backward refills from y (widen_output returns it filled).
  float* widened_output(const Workspace& ws);
  void round_output(Workspace& ws);
  const float* widen_output(const Workspace& ws);
  int batch_, seq_len_, channels_, n_head_, tile_;
  Tensor lse_;         // saved by forward, on the workspace's device
  Tensor delta_;       // cuda only
  Tensor widened_[3];  // bf16 operands without the bf16 kernels: q, k, v widened by forward
  Tensor widened_y_;   // a bf16 y without the bf16 kernels (widened_output)
};

}  // namespace ft
