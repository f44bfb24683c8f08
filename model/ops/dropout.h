// Inverted dropout: in training with p > 0, each element is kept with probability 1 - p and scaled
// by 1 / (1 - p), else zeroed; otherwise (p == 0) it is an identity copy. Eval graphs contain no
// dropout ops at all.
// The keep decision for element i is hash_uniform(ws.dropout_seed ^ salt, i) >= p (core/rng.h):
// a pure function of the step's seed, the op's salt and the index, so a CUDA kernel or a rerun
// draws the same mask. Forward stores the mask as bytes for backward.
// Inputs {x}, outputs {y}.
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>
#include <vector>

#include "model/graph.h"

namespace ft {

// Writes y and keep_mask (1 = kept). REQUIRES: 0 < p < 1.
void dropout_forward(float* y, uint8_t* keep_mask, const float* x, float p, uint64_t seed,
                     int64_t numel);
// dx += dy * keep / (1 - p).
void dropout_backward(float* dx, const float* dy, const uint8_t* keep_mask, float p, int64_t numel);

class DropoutOp : public Op {
 public:
  // REQUIRES: 0 <= p < 1. `salt` must differ between the dropout ops of one graph.
  DropoutOp(int64_t numel, float p, uint64_t salt);
  OpKind op_kind() const override { return OpKind::kDropout; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;

  float p() const { return p_; }
  uint64_t salt() const { return salt_; }
  // Whether the last forward applied a mask (p > 0).
  bool masked() const { return masked_; }
  const std::vector<uint8_t>& keep_mask() const { return keep_mask_; }

 private:
  void check_wiring(const Workspace& ws) const;
  int64_t numel_;
  float p_;
  uint64_t salt_;
  bool masked_ = false;
  std::vector<uint8_t> keep_mask_;  // [numel], valid when masked_
};

}  // namespace ft
