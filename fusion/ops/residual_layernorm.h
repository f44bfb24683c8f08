// Vertical fusion of [dropout ->] residual add -> LayerNorm (Megatron's bias-dropout-add, llm.c's
// fused residual): per row r of C columns,
//   branch'  = p > 0 ? branch * keep / (1 - p) : branch   keep_i = hash_uniform(seed ^ salt, i) >=
//   p out[r]   = residual_in[r] + branch'[r]                  (the residual stream, a graph value)
//   normed[r] = (out[r] - mean_r) * rstd_r * weight + bias  eps 1e-5
// The row is written to `out` and normalised while it is still in L1; the dropout'd branch never
// exists as a tensor. The unfused twin is DropoutOp -> ResidualAddOp -> LayerNormOp
// (model/ops/dropout.h, residual.h, layernorm.h); the mask is bit-identical to DropoutOp's
// (element index i = r * C + c), and the row math is kernels/layernorm_math.h's.
// Backward: `out` has other readers (the next residual add), so its gradient is the sum
//   d_out = dout (from those readers) + LN'(d normed)
// which then flows to both summands: d residual_in += d_out, d branch += d_out * keep / (1 - p).
// Inputs {residual_in, branch}, outputs {out, normed}, all [rows, C], any of them a column view;
// params {ln weight [C], ln bias [C]}. Forward saves mean, rstd per row and the byte mask, on the
// workspace's device.
// CUDA (residual_layernorm.cu): one warp per row for forward and the input gradients, the mask
// drawn with the same kernels/dropout_math.h helper; the weight and bias gradients go through
// LayerNorm's deterministic column reduction (model/ops/layernorm.h) over d normed and out.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/math/bf16_math.h"
#include "model/graph.h"

namespace ft {

// CUDA launchers (residual_layernorm.cu; CUDA builds only), on device pointers, enqueued on
// `stream`. Strides are floats between rows of each tensor; gradients share their value's.
// keep_mask [rows * C] bytes is written (forward) and read (backward) only when dropout_p > 0,
// with the seed *step_seed ^ salt (step_seed: Workspace::device_dropout_seed, read only then).
void residual_layernorm_forward_cuda(float* out, float* normed, uint8_t* keep_mask, float* mean,
                                     float* rstd, const float* residual_in, const float* branch,
                                     const float* weight, const float* bias, float dropout_p,
                                     const uint64_t* step_seed, uint64_t salt, int64_t rows,
                                     int64_t channels, int64_t out_stride, int64_t normed_stride,
                                     int64_t in_stride, int64_t branch_stride, CudaStream stream);
// The same with `normed` written in bf16 (fusion.vertical.cast under train.precision: bf16).
void residual_layernorm_forward_cuda(float* out, bf16_bits* normed, uint8_t* keep_mask, float* mean,
                                     float* rstd, const float* residual_in, const float* branch,
                                     const float* weight, const float* bias, float dropout_p,
                                     const uint64_t* step_seed, uint64_t salt, int64_t rows,
                                     int64_t channels, int64_t out_stride, int64_t normed_stride,
                                     int64_t in_stride, int64_t branch_stride, CudaStream stream);
// d_in (+)= total and d_branch (+)= masked, scaled total (see residual_layernorm.cpp); `=` where
// fresh_in / fresh_branch. The weight and bias gradients are not touched here.
void residual_layernorm_backward_input_cuda(float* d_in, float* d_branch, const float* d_out,
                                            const float* d_normed, const float* out,
                                            const float* weight, const uint8_t* keep_mask,
                                            const float* mean, const float* rstd, float dropout_p,
                                            bool fresh_in, bool fresh_branch, int64_t rows,
                                            int64_t channels, int64_t out_stride,
                                            int64_t normed_stride, int64_t in_stride,
                                            int64_t branch_stride, CudaStream stream);

class ResidualLayerNormOp : public Op {
 public:
  // dropout_p 0: no dropout was absorbed (eval graphs, model.dropout 0, or max_ops split).
  // tile_rows: the most rows per parallel work item, sized by the pass from fusion.tile_kb (see
  // work_item_rows); the weight and bias gradients are summed per item, then item by item in
  // order, so the bits do not depend on the thread count.
  // REQUIRES: rows, channels, tile_rows > 0; 0 <= dropout_p < 1.
  ResidualLayerNormOp(int64_t rows, int64_t channels, float dropout_p, uint64_t dropout_salt,
                      int tile_rows);
  OpKind op_kind() const override { return OpKind::kResidualLayerNorm; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  bool supports_views() const override { return true; }
  // `normed` may be bf16 (fusion/cast_pass.cpp), written from an fp32 row buffer.
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int64_t rows() const { return rows_; }
  int64_t channels() const { return channels_; }
  float dropout_p() const { return dropout_p_; }
  uint64_t dropout_salt() const { return dropout_salt_; }
  int tile_rows() const { return tile_rows_; }
  // Host copies of what the last forward saved; the mask is empty when dropout_p() == 0.
  std::vector<uint8_t> keep_mask() const;
  std::vector<float> mean() const { return mean_.to_host_vector(); }
  std::vector<float> rstd() const { return rstd_.to_host_vector(); }

  // Bytes per row live while a tile is processed, for the pass's fusion.tile_kb check: backward
  // touches out, d_out, d normed and both input gradients (5 floats per column), plus the mask
  // byte and the tile's weight and bias partials, rounded up to 6 floats.
  static int64_t live_bytes_per_row(int64_t channels) { return 6 * 4 * channels; }
  // Rows per work item: tile_rows, at most kMaxWorkItemRows, so that a few threads share the rows
  // evenly. Whole tiles did not: gpt_small's 1024 rows in tiles of 170 made 7 items, 4 of them
  // on one of 2 threads (the op ran 1.2x faster on 2 threads than on 1, LayerNorm alone 1.8x).
  static constexpr int64_t kMaxWorkItemRows = 32;
  int64_t work_item_rows() const { return std::min<int64_t>(tile_rows_, kMaxWorkItemRows); }

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  void backward_cuda(Workspace& ws, ParamStore& params);
  uint8_t* keep_mask_bytes() { return reinterpret_cast<uint8_t*>(keep_mask_.data()); }

  int64_t rows_, channels_;
  float dropout_p_;
  uint64_t dropout_salt_;
  int tile_rows_;
  // On the workspace's device, written by forward: [rows * C] bytes, 1 = kept, in float storage
  // (Tensor holds floats; empty when dropout_p_ == 0), and mean and rstd [rows].
  Tensor keep_mask_;
  Tensor mean_, rstd_;
  Tensor param_grad_scratch_;  // cuda: the column partials of the weight and bias gradients
};

}  // namespace ft
