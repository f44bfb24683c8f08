// FlashAttentionOp (see flash_attention.h): wiring checks, the saved log-sum-exp, and the bf16
// operands of train.precision: bf16. There the eager twin's two GEMMs read bf16 q, k, v (cast
// ops' outputs); the fused kernels read them widened once to fp32 (exact), so their products are
// those of the same bf16-rounded values, while P and dS stay fp32 inside the tiles (the eager
// twin rounds them to bf16 for its GEMMs: tests/precision_test.cpp states the tolerance).
#include <vector>

#include "core/bf16_cast.h"
#include "core/check.h"
#if defined(FT_HAVE_CUDA)
#include "core/cuda/bf16_kernels.h"
#endif
#include "fusion/ops/flash_attention.h"
#include "model/ops/attention_heads.h"
#include "model/ops/op_checks.h"

namespace ft {

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
  expect_gemm_operands(*this, ws.values[inputs[0]], ws.values[inputs[1]]);
  expect_gemm_operands(*this, ws.values[inputs[0]], ws.values[inputs[2]]);
  if (ws.values[inputs[0]].dtype() == DType::kBF16)
    for (size_t i = 0; i < inputs.size(); ++i)
      FT_CHECK(ws.row_stride(inputs[i]) == channels_, kind(), " '", name, "': bf16 input ", i,
               " (q, k, v) must not be a view");
}

AttentionStrides FlashAttentionOp::strides(const Workspace& ws) const {
  return {ws.row_stride(inputs[0]), ws.row_stride(inputs[1]), ws.row_stride(inputs[2]),
          ws.row_stride(outputs[0])};
}

FlashAttentionOp::Operands FlashAttentionOp::operands(const Workspace& ws, bool widen) {
  if (ws.values[inputs[0]].dtype() == DType::kF32)
    return {ws.values[inputs[0]].data(), ws.values[inputs[1]].data(), ws.values[inputs[2]].data()};
  for (int i = 0; i < 3; ++i) {
    const Tensor& value = ws.values[inputs[i]];
    if (widen) {
      reuse_or_allocate(widened_[i], value.numel(), ws.device);
#if defined(FT_HAVE_CUDA)
      if (ws.device == Device::kCuda) {
        cuda_widen_bf16(widened_[i].data(), value.bf16_data(), value.numel(), ws.stream);
        continue;
      }
#endif
      cast_to_float(widened_[i].data(), value.bf16_data(), value.numel());
    }
  }
  return {widened_[0].data(), widened_[1].data(), widened_[2].data()};
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
  const Operands in = operands(ws, /*widen=*/true);
  FT_RUN_ON_CUDA(ws, flash_attention_forward_cuda(ws.values[outputs[0]].data(), lse_.data(), in.q,
                                                  in.k, in.v, strides(ws), batch_, seq_len_,
                                                  channels_, n_head_, ws.stream));
  flash_attention_forward(ws.values[outputs[0]].data(), lse_.data(), in.q, in.k, in.v, strides(ws),
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
  // The widened copies of forward still hold q, k and v: nothing writes a value in between.
  const Operands in = operands(ws, /*widen=*/false);
  FT_RUN_ON_CUDA(
      ws, flash_attention_backward_cuda(ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(),
                                        ws.grads[inputs[2]].data(), delta_scratch(ws.device),
                                        ws.grads[outputs[0]].data(), ws.values[outputs[0]].data(),
                                        lse_.data(), in.q, in.k, in.v, strides(ws), batch_,
                                        seq_len_, channels_, n_head_, ws.stream));
  flash_attention_backward(ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(),
                           ws.grads[inputs[2]].data(), ws.grads[outputs[0]].data(),
                           ws.values[outputs[0]].data(), lse_.data(), in.q, in.k, in.v, strides(ws),
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
  // bf16 operands are kept widened for backward: three [B*T, C] fp32 copies.
  if (graph.values[inputs[0]].dtype == DType::kBF16)
    cost.saved_bytes += 3.0 * 4.0 * batch_ * seq_len_ * channels_;
  return cost;
}

}  // namespace ft
