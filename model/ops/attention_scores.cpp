// Attention scores (see attention_scores.h). Per sequence b, with heads as the gemm batch:
//   S = scale Q K^T.
#include "model/ops/attention_scores.h"

#include "core/check.h"
#include "core/gemm.h"
#include "kernels/attention_heads.h"
#include "model/ops/linear.h"
#include "model/ops/op_checks.h"

namespace ft {

void attention_scores_forward(float* scores, GemmOperand q, GemmOperand k, int64_t q_stride,
                              int64_t k_stride, int batch, int seq_len, int channels, int n_head) {
  const int64_t T = seq_len, hd = channels / n_head;
  // S[h] = scale Q[h] K[h]^T: [T, hd] x [hd, T]; K[h] is stored [T, hd] = [N, K].
  const GemmArgs args = attention_scores_gemm(T, hd, n_head, q_stride, k_stride);
  for (int b = 0; b < batch; ++b)
    gemm(scores + b * n_head * T * T, q.at(b * T * q_stride), k.at(b * T * k_stride), args);
}

void attention_scores_backward(float* dq, float* dk, const float* dscores, GemmOperand q,
                               GemmOperand k, int64_t q_stride, int64_t k_stride, bool overwrite_dq,
                               bool overwrite_dk, int batch, int seq_len, int channels,
                               int n_head) {
  const int64_t T = seq_len, hd = channels / n_head;
  const GemmOperand dS =
      q.dtype == DType::kBF16
          ? GemmOperand(bf16_gradient_copy(dscores, int64_t{batch} * n_head * T, T, T))
          : GemmOperand(dscores);
  const AttentionScoresGradGemms gemms =
      attention_scores_grad_gemms(T, hd, n_head, q_stride, k_stride, overwrite_dq, overwrite_dk);
  const GemmArgs &dqueries = gemms.dqueries, &dkeys = gemms.dkeys;
  for (int b = 0; b < batch; ++b) {
    const GemmOperand ds = dS.at(b * n_head * T * T);
    gemm(dq + b * T * q_stride, ds, k.at(b * T * k_stride), dqueries);
    gemm(dk + b * T * k_stride, ds, q.at(b * T * q_stride), dkeys);
  }
}

AttentionScoresOp::AttentionScoresOp(int batch, int seq_len, int channels, int n_head)
    : AttentionHeadGemmOp("AttentionScoresOp", batch, seq_len, channels, n_head) {}

void AttentionScoresOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 2, 1, 0);
  expect_numel(ws.values[inputs[0]], tokens() * channels_, *this, "input q");
  expect_numel(ws.values[inputs[1]], tokens() * channels_, *this, "input k");
  expect_numel(ws.values[outputs[0]], scores_numel(), *this, "output scores");
  expect_gemm_operands(*this, ws.values[inputs[0]], ws.values[inputs[1]]);
  FT_CHECK(ws.row_stride(outputs[0]) == seq_len_, kind(), " '", name,
           "': output scores must not be a view");
}

void AttentionScoresOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws,
                 attention_scores_forward_cuda(
                     ws.values[outputs[0]].data(), value_operand(ws.values[inputs[0]]),
                     value_operand(ws.values[inputs[1]]), ws.row_stride(inputs[0]),
                     ws.row_stride(inputs[1]), batch_, seq_len_, channels_, n_head_, ws.stream));
  attention_scores_forward(ws.values[outputs[0]].data(), value_operand(ws.values[inputs[0]]),
                           value_operand(ws.values[inputs[1]]), ws.row_stride(inputs[0]),
                           ws.row_stride(inputs[1]), batch_, seq_len_, channels_, n_head_);
}

void AttentionScoresOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  // With q and k one value, dk must add to the dq just written.
  const bool same = inputs[0] == inputs[1];
  FT_RUN_ON_CUDA(
      ws,
      attention_scores_backward_cuda(
          ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(), ws.grads[outputs[0]].data(),
          value_operand(ws.values[inputs[0]]), value_operand(ws.values[inputs[1]]),
          ws.row_stride(inputs[0]), ws.row_stride(inputs[1]), ws.grad_is_fresh(inputs[0]),
          ws.grad_is_fresh(inputs[1]) && !same, batch_, seq_len_, channels_, n_head_, ws.stream));
  attention_scores_backward(
      ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(), ws.grads[outputs[0]].data(),
      value_operand(ws.values[inputs[0]]), value_operand(ws.values[inputs[1]]),
      ws.row_stride(inputs[0]), ws.row_stride(inputs[1]), ws.grad_is_fresh(inputs[0]),
      ws.grad_is_fresh(inputs[1]) && !same, batch_, seq_len_, channels_, n_head_);
}

}  // namespace ft
