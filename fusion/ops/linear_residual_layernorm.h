// A block's projection (c_proj) with the [dropout ->] residual add -> LayerNorm after it, over
// row tiles:
//   branch = x W^T + b                                         (one tile of rows, in cache)
//   out    = residual_in + branch'   normed = LayerNorm(out)   (ResidualLayerNormOp's rows)
// The eager chain writes the projection's [rows, C] output and reads it back; here each row tile
// of it goes from the GEMM to the residual add while it is in cache. Backward runs the same tiles:
// ResidualLayerNormOp's rows give d out and the branch's gradient dy into a tile, which is
// summed into db and (bf16 GEMMs) rounded once, row by row, and multiplied by W for the tile's dx
// while it is hot; dW = dy^T x takes every row at the end. LinearOp's backward would read its fp32
// dy from memory twice (the rounding copy and db) after ResidualLayerNormOp wrote it.
// The unfused twin is LinearOp -> ResidualLayerNormOp at the same tile_rows (fusion.max_ops 2):
// the same GEMMs on the same rows, the same row loops, db summed row by row in order, and the
// LayerNorm's weight and bias gradients summed per tile then tile by tile, so the two agree bit
// for bit (tests/fusion_residual_layernorm_test.cpp).
// Inputs {residual_in [rows, C] fp32, x [rows, in] fp32 or bf16 (the GEMM operand)}, outputs
// {out [rows, C] fp32, normed [rows, C] fp32 or bf16}; params {W [out rows of a weight], b when
// has_bias, LayerNorm weight [C], LayerNorm bias [C]}. CUDA runs the pair's kernels one after the
// other through an fp32 [rows, C] branch buffer (linear.cu, residual_layernorm.cu).
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>
#include <vector>

#include "core/math/bf16_math.h"
#include "core/tensor.h"
#include "model/graph.h"

namespace ft {

class LinearResidualLayerNormOp : public Op {
 public:
  // The Linear's shape (rows, in_features -> channels, has_bias, its rows of the weight from
  // weight_row_offset) and ResidualLayerNormOp's (dropout_p, dropout_salt, tile_rows), which also
  // sets the GEMM's row tiles.
  // REQUIRES: rows, in_features, channels, tile_rows > 0; 0 <= dropout_p < 1.
  LinearResidualLayerNormOp(int64_t rows, int64_t in_features, int64_t channels, bool has_bias,
                            int64_t weight_row_offset, float dropout_p, uint64_t dropout_salt,
                            int tile_rows);
  OpKind op_kind() const override { return OpKind::kLinearResidualLayerNorm; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int tile_rows() const { return tile_rows_; }

 private:
  // Where the parameters sit in `params`: W, b (has_bias), then the LayerNorm's two.
  int ln_weight_index() const { return has_bias_ ? 2 : 1; }
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  void forward_cuda(Workspace& ws, ParamStore& params);
  void backward_cuda(Workspace& ws, ParamStore& params);
  uint8_t* keep_mask_bytes() { return reinterpret_cast<uint8_t*>(keep_mask_.data()); }

  int64_t rows_, in_features_, channels_;
  bool has_bias_;
  int64_t weight_row_offset_;
  float dropout_p_;
  uint64_t dropout_salt_;
  int tile_rows_;
  Tensor keep_mask_, mean_, rstd_;  // as ResidualLayerNormOp's, on the workspace's device
  // CPU: one row tile of the GEMM's output and of dy (fp32 GEMMs: dy for every row, which dW
  // reads); cuda: every row of both.
  Tensor branch_, dbranch_;
  std::vector<bf16_bits> dbranch_bf16_;  // CPU, bf16 GEMMs: dy rounded, every row
  Tensor param_grad_scratch_;            // cuda: the LayerNorm's column partials
};

}  // namespace ft
