// Horizontal fusion of `count` Linears that read the same input and own consecutive row blocks of
// one weight (q, k and v over c_attn): one GEMM
//   y[rows, count * width] = x[rows, in] · W[offset : offset + count * width, :]^T + b[same rows]
// instead of `count` GEMMs of `width` output columns each. The unfused twin is `count` LinearOps
// (model/ops/linear.h) with weight_row_offset offset, offset + width, ...; fusion/qkv_pass.cpp
// makes their outputs column views of this op's output, so consumers read q, k, v in place.
// Backward is the Linear backward over the wide dy: dx += dy W, dW += dy^T x, db += colsum(dy),
// which sums the three Linears' dx contributions inside one GEMM instead of three.
// Inputs {x}, outputs {y [rows, count * width]} (either may be a view), params {weight, bias when
// has_bias}.
// bf16 y (fusion.vertical.cast absorbed the casts of q, k and v, fusion/cast_pass.cpp): where the
// CPU has bf16 instructions oneDNN rounds C into y as it stores it (gemm_bf16_output); elsewhere
// the GEMM writes fp32 row tiles of `bf16_tile_rows` rows into a scratch that stays in cache, each
// rounded into y. Both round as the eager cast ops do (bit for bit: the same fp32 sums). On cuda
// one fp32 scratch of all rows, then the cast kernel. Backward is the same, its dy being fp32
// whatever y's dtype; on the CPU in bf16 one sweep over dy both rounds it for the GEMMs and sums db
// (LinearOp's reads it twice), bit for bit with LinearOp. On cuda forward and backward run
// linear.h's *_cuda launchers (via linear_op_forward/backward). Thread safety: an op instance
// belongs to one training thread (gemm runs on oneDNN's pool).
#pragma once
#include <cstdint>
#include <vector>

#include "model/graph.h"

namespace ft {

class QkvLinearOp : public Op {
 public:
  // REQUIRES: rows, in_features, width, count > 0; weight_row_offset >= 0; bf16_tile_rows >= 1
  // (used only when y is bf16).
  QkvLinearOp(int64_t rows, int64_t in_features, int64_t width, int count, bool has_bias,
              int64_t weight_row_offset, int64_t bf16_tile_rows = 1);
  OpKind op_kind() const override { return OpKind::kQkvLinear; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool supports_views() const override { return true; }
  bool overwrites_fresh_input_grads() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int64_t rows() const { return rows_; }
  int64_t in_features() const { return in_features_; }
  int64_t width() const { return width_; }  // output columns of each absorbed Linear
  int count() const { return count_; }
  int64_t out_features() const { return width_ * count_; }
  bool has_bias() const { return has_bias_; }
  int64_t weight_row_offset() const { return weight_row_offset_; }
  int64_t bf16_tile_rows() const { return bf16_tile_rows_; }

 private:
  void forward_into_bf16(Workspace& ws, ParamStore& params);
  void backward_bf16_cpu(Workspace& ws, ParamStore& params);

  int64_t rows_, in_features_, width_;
  int count_;
  bool has_bias_;
  int64_t weight_row_offset_, bf16_tile_rows_;
  Tensor fp32_tile_;                // bf16 y: the GEMM's fp32 rows before rounding
  std::vector<bf16_bits> dy_bf16_;  // bf16 x on the CPU: dy rounded for the backward GEMMs
};

}  // namespace ft
