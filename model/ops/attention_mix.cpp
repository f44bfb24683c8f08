// Attention mix (see attention_mix.h). Per sequence b, with heads as the gemm batch: Y = P V.
#include "model/ops/attention_mix.h"

#include "core/check.h"
#include "core/gemm.h"
#include "kernels/attention_heads.h"
#include "model/ops/linear.h"
#include "model/ops/op_checks.h"

namespace ft {

void attention_mix_forward(float* y, GemmOperand probs, GemmOperand v, int64_t y_stride,
                           int64_t v_stride, int batch, int seq_len, int channels, int n_head) {
  const int64_t T = seq_len, hd = channels / n_head;
  // Y[h] = P[h] V[h]: [T, T] x [T, hd], written into head h's columns of y.
  const GemmArgs args = square_by_head_gemm(T, hd, n_head, v_stride, y_stride);
  for (int b = 0; b < batch; ++b)
    gemm(y + b * T * y_stride, probs.at(b * n_head * T * T), v.at(b * T * v_stride), args);
}

void attention_mix_backward(float* dprobs, float* dv, const float* dy, GemmOperand probs,
                            GemmOperand v, int64_t y_stride, int64_t v_stride,
                            bool overwrite_dprobs, bool overwrite_dv, int batch, int seq_len,
                            int channels, int n_head) {
  const int64_t T = seq_len, hd = channels / n_head;
  if (y_stride == 0) y_stride = channels;
  // In bf16 the products read a packed bf16 copy of dY, whose rows are C elements apart.
  const bool bf16 = v.dtype == DType::kBF16;
  const int64_t dy_stride = bf16 ? channels : y_stride;
  const GemmOperand dY =
      bf16 ? GemmOperand(bf16_gradient_copy(dy, int64_t{batch} * T, channels, y_stride))
           : GemmOperand(dy);
  const AttentionMixGradGemms gemms =
      attention_mix_grad_gemms(T, hd, n_head, dy_stride, v_stride, overwrite_dprobs, overwrite_dv);
  const GemmArgs &dp_args = gemms.dprobs, &dv_args = gemms.dvalues;
  for (int b = 0; b < batch; ++b) {
    const GemmOperand dy_b = dY.at(b * T * dy_stride);
    gemm(dprobs + b * n_head * T * T, dy_b, v.at(b * T * v_stride), dp_args);
    gemm(dv + b * T * v_stride, probs.at(b * n_head * T * T), dy_b, dv_args);
  }
}

AttentionMixOp::AttentionMixOp(int batch, int seq_len, int channels, int n_head)
    : AttentionHeadGemmOp("AttentionMixOp", batch, seq_len, channels, n_head) {}

void AttentionMixOp::check_wiring(const Workspace& ws) const {
  expect_arity(*this, 2, 1, 0);
  expect_numel(ws.values[inputs[0]], scores_numel(), *this, "input probs");
  expect_numel(ws.values[inputs[1]], tokens() * channels_, *this, "input v");
  expect_numel(ws.values[outputs[0]], tokens() * channels_, *this, "output y");
  FT_CHECK(ws.row_stride(inputs[0]) == seq_len_, kind(), " '", name,
           "': input probs must not be a view");
  expect_gemm_operands(*this, ws.values[inputs[0]], ws.values[inputs[1]]);
}

void AttentionMixOp::forward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(ws, attention_mix_forward_cuda(ws.values[outputs[0]].data(),
                                                value_operand(ws.values[inputs[0]]),
                                                value_operand(ws.values[inputs[1]]),
                                                ws.row_stride(outputs[0]), ws.row_stride(inputs[1]),
                                                batch_, seq_len_, channels_, n_head_, ws.stream));
  attention_mix_forward(ws.values[outputs[0]].data(), value_operand(ws.values[inputs[0]]),
                        value_operand(ws.values[inputs[1]]), ws.row_stride(outputs[0]),
                        ws.row_stride(inputs[1]), batch_, seq_len_, channels_, n_head_);
}

void AttentionMixOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_RUN_ON_CUDA(
      ws, attention_mix_backward_cuda(
              ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(), ws.grads[outputs[0]].data(),
              value_operand(ws.values[inputs[0]]), value_operand(ws.values[inputs[1]]),
              ws.row_stride(outputs[0]), ws.row_stride(inputs[1]), ws.grad_is_fresh(inputs[0]),
              ws.grad_is_fresh(inputs[1]), batch_, seq_len_, channels_, n_head_, ws.stream));
  attention_mix_backward(ws.grads[inputs[0]].data(), ws.grads[inputs[1]].data(),
                         ws.grads[outputs[0]].data(), value_operand(ws.values[inputs[0]]),
                         value_operand(ws.values[inputs[1]]), ws.row_stride(outputs[0]),
                         ws.row_stride(inputs[1]), ws.grad_is_fresh(inputs[0]),
                         ws.grad_is_fresh(inputs[1]), batch_, seq_len_, channels_, n_head_);
}

}  // namespace ft
