// FlashAttentionOp (see flash_attention.h): wiring checks, the saved log-sum-exp, and the bf16
// operands of train.precision: bf16. There the eager twin's GEMMs read bf16 q, k, v (cast ops'
// outputs) and bf16 P, dS and dY. On a CPU with AVX512-BF16 the fused kernels do the same
// (flash_attention_bf16.h); elsewhere (and on cuda) they read q, k, v widened once to fp32
// (exact), and the CPU kernels round P, dS and dY to bf16 inside the tiles as the bf16 kernels do
// (TileRounding::kBf16), so both CPU paths agree to fp32 accumulation order.
#include <vector>

#include "core/bf16_cast.h"
#include "core/check.h"
#if defined(FT_HAVE_CUDA)
#include "core/cuda/bf16_kernels.h"
#endif
#include "fusion/ops/flash_attention.h"
#include "fusion/ops/flash_attention_bf16.h"
#include "kernels/attention_heads.h"
#include "model/ops/cast.h"
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
}

namespace {

// Elements from a [rows, width] view's first element to its last, rows `stride` apart: what the
// widening copies so that the fp32 copy keeps the view's stride, the one stride the kernels take
// for an input's value and its gradient alike.
int64_t strided_span(int64_t rows, int64_t width, int64_t stride) {
  return (rows - 1) * stride + width;
}

}  // namespace

AttentionStrides FlashAttentionOp::strides(const Workspace& ws) const {
  return {ws.row_stride(inputs[0]), ws.row_stride(inputs[1]), ws.row_stride(inputs[2]),
          ws.row_stride(outputs[0])};
}

FlashAttentionOp::Operands FlashAttentionOp::operands(const Workspace& ws, bool widen) {
  if (ws.values[inputs[0]].dtype() == DType::kF32)
    return {ws.values[inputs[0]].data(), ws.values[inputs[1]].data(), ws.values[inputs[2]].data()};
  const int64_t rows = static_cast<int64_t>(batch_) * seq_len_;
  for (int i = 0; i < 3; ++i) {
    const Tensor& value = ws.values[inputs[i]];
    if (widen) {
      // A view (q, k, v of the QKV GEMM's bf16 output) widens with its siblings' columns between
      // its rows: exact, and the fallback path's cost, not the bf16 kernels'.
      const int64_t span = strided_span(rows, channels_, ws.row_stride(inputs[i]));
      reuse_or_allocate(widened_[i], span, ws.device);
#if defined(FT_HAVE_CUDA)
      if (ws.device == Device::kCuda) {
        cuda_widen_bf16(widened_[i].data(), value.bf16_data(), span, ws.stream);
        continue;
      }
#endif
      cast_to_float(widened_[i].data(), value.bf16_data(), span);
    }
  }
  return {widened_[0].data(), widened_[1].data(), widened_[2].data()};
}

bool FlashAttentionOp::runs_bf16_tiles(const Workspace& ws) const {
  return ws.device == Device::kCpu && ws.values[inputs[0]].dtype() == DType::kBF16 &&
         flash_attention_bf16_native();
}

TileRounding FlashAttentionOp::tile_rounding(const Workspace& ws) const {
  return ws.values[inputs[0]].dtype() == DType::kBF16 ? TileRounding::kBf16 : TileRounding::kNone;
}

float* FlashAttentionOp::widened_output(const Workspace& ws) {
  const int64_t rows = static_cast<int64_t>(batch_) * seq_len_;
  reuse_or_allocate(widened_y_, strided_span(rows, channels_, ws.row_stride(outputs[0])),
                    ws.device);
  return widened_y_.data();
}

void FlashAttentionOp::round_output(Workspace& ws) {
  const int64_t rows = static_cast<int64_t>(batch_) * seq_len_, stride = ws.row_stride(outputs[0]);
  bf16_bits* y = ws.values[outputs[0]].bf16_data();
  FT_RUN_ON_CUDA(
      ws, cast_forward_cuda(y, widened_y_.data(), rows, channels_, stride, stride, ws.stream));
  cast_forward(y, widened_y_.data(), rows, channels_, stride, stride);
}

const float* FlashAttentionOp::widen_output(const Workspace& ws) {
  float* widened = widened_output(ws);
  const int64_t span = widened_y_.numel();
  const bf16_bits* y = ws.values[outputs[0]].bf16_data();
#if defined(FT_HAVE_CUDA)
  if (ws.device == Device::kCuda) {
    cuda_widen_bf16(widened, y, span, ws.stream);
    return widened;
  }
#endif
  cast_to_float(widened, y, span);
  return widened;
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
  Tensor& y_value = ws.values[outputs[0]];
  const bool y_in_bf16 = y_value.dtype() == DType::kBF16;
  if (runs_bf16_tiles(ws)) {
    const Tensor &q = ws.values[inputs[0]], &k = ws.values[inputs[1]], &v = ws.values[inputs[2]];
    if (y_in_bf16)
      flash_attention_forward_bf16(y_value.bf16_data(), lse_.data(), q.bf16_data(), k.bf16_data(),
                                   v.bf16_data(), strides(ws), batch_, seq_len_, channels_, n_head_,
                                   tile_);
    else
      flash_attention_forward_bf16(y_value.data(), lse_.data(), q.bf16_data(), k.bf16_data(),
                                   v.bf16_data(), strides(ws), batch_, seq_len_, channels_, n_head_,
                                   tile_);
    return;
  }
  const Operands in = operands(ws, /*widen=*/true);
  // Without the bf16 tiles a bf16 y is written as the twin writes it: fp32, then rounded.
  float* y = y_in_bf16 ? widened_output(ws) : y_value.data();
  forward_fp32_kernels(ws, y, in);
  if (y_in_bf16) round_output(ws);
}

void FlashAttentionOp::forward_fp32_kernels(const Workspace& ws, float* y, const Operands& in) {
  FT_RUN_ON_CUDA(ws, flash_attention_forward_cuda(y, lse_.data(), in.q, in.k, in.v, strides(ws),
                                                  batch_, seq_len_, channels_, n_head_, ws.stream));
  flash_attention_forward(y, lse_.data(), in.q, in.k, in.v, strides(ws), batch_, seq_len_,
                          channels_, n_head_, tile_, tile_rounding(ws));
}

void FlashAttentionOp::backward(Workspace& ws, ParamStore&) {
  check_wiring(ws);
  FT_CHECK(lse_.numel() == static_cast<int64_t>(batch_) * n_head_ * seq_len_ &&
               lse_.device() == ws.device,
           kind(), " '", name, "': backward before forward");
  // A fresh gradient is written, not added into: by the bf16 tiles themselves (a root, or a view
  // of overwrites_fresh_view_grads) unless q, k or v is read twice; for the other kernels, which
  // accumulate, by zeroing it here, B*T*C floats against O(T^2) work (a root: views go fresh only
  // to the bf16 tiles).
  const bool tiles = runs_bf16_tiles(ws);
  const bool distinct = inputs[0] != inputs[1] && inputs[1] != inputs[2] && inputs[0] != inputs[2];
  bool write[3];
  for (int i = 0; i < 3; ++i) {
    const bool fresh = ws.grad_is_fresh(inputs[i]);
    write[i] = fresh && tiles && distinct;
    if (!fresh || write[i]) continue;
    FT_CHECK(ws.row_stride(inputs[i]) == channels_, kind(), " '", name,
             "': a fresh view gradient, which only the bf16 tiles take");
    ws.grads[inputs[i]].fill(0.0f);
  }
  const Tensor& y_value = ws.values[outputs[0]];
  const bool y_in_bf16 = y_value.dtype() == DType::kBF16;
  float *dq = ws.grads[inputs[0]].data(), *dk = ws.grads[inputs[1]].data(),
        *dv = ws.grads[inputs[2]].data();
  const float* dy = ws.grads[outputs[0]].data();
  if (tiles) {
    const Tensor &q = ws.values[inputs[0]], &k = ws.values[inputs[1]], &v = ws.values[inputs[2]];
    if (y_in_bf16)
      flash_attention_backward_bf16(dq, dk, dv, dy, y_value.bf16_data(), lse_.data(), q.bf16_data(),
                                    k.bf16_data(), v.bf16_data(), strides(ws), batch_, seq_len_,
                                    channels_, n_head_, tile_, {write[0], write[1], write[2]});
    else
      flash_attention_backward_bf16(dq, dk, dv, dy, y_value.data(), lse_.data(), q.bf16_data(),
                                    k.bf16_data(), v.bf16_data(), strides(ws), batch_, seq_len_,
                                    channels_, n_head_, tile_, {write[0], write[1], write[2]});
    return;
  }
  // The widened copies of forward still hold q, k and v: nothing writes a value in between. A
  // bf16 y is widened (D = <dY, Y> on the Y the projection read, as the bf16 tiles take it).
  const Operands in = operands(ws, /*widen=*/false);
  const float* y = y_in_bf16 ? widen_output(ws) : y_value.data();
  FT_RUN_ON_CUDA(ws, flash_attention_backward_cuda(
                         dq, dk, dv, delta_scratch(ws.device), dy, y, lse_.data(), in.q, in.k, in.v,
                         strides(ws), batch_, seq_len_, channels_, n_head_, ws.stream));
  flash_attention_backward(dq, dk, dv, dy, y, lse_.data(), in.q, in.k, in.v, strides(ws), batch_,
                           seq_len_, channels_, n_head_, tile_, tile_rounding(ws));
}

OpCost FlashAttentionOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  // Only the causal half of the (t, s) pairs is computed (diagonal tiles included).
  const double pairs = static_cast<double>(batch_) * n_head_ * seq_len_ * (seq_len_ + 1) / 2;
  const double hd = channels_ / n_head_;
  cost.forward_flops = pairs * (4 * hd + 4);             // S = QK^T, Y += PV, online softmax
  cost.backward_flops = pairs * (10 * hd + 6);           // S again, dP, dV, dQ, dK, dS
  cost.saved_bytes = 4.0 * batch_ * n_head_ * seq_len_;  // the log-sum-exp
  // bf16 operands are kept widened for backward, three fp32 copies of their rows' span, unless
  // the bf16 kernels read them as they are; so is a bf16 y (widened_y_).
  if (flash_attention_bf16_native()) return cost;
  const int64_t rows = static_cast<int64_t>(batch_) * seq_len_;
  if (graph.values[inputs[0]].dtype == DType::kBF16)
    for (ValueId id : inputs)
      cost.saved_bytes += 4.0 * strided_span(rows, channels_, graph.row_stride(id));
  if (graph.values[outputs[0]].dtype == DType::kBF16)
    cost.saved_bytes += 4.0 * strided_span(rows, channels_, graph.row_stride(outputs[0]));
  return cost;
}

}  // namespace ft
