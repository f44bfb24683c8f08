// Inverted dropout: in training with p > 0, each element is kept with probability 1 - p and scaled
// by 1 / (1 - p), else zeroed; otherwise (p == 0) it is an identity copy. Eval graphs contain no
// dropout ops at all.
// The keep decision for element i is hash_uniform(ws.dropout_seed ^ salt, i) >= p (core/rng.h):
// a pure function of the step's seed, the op's salt and the index, so a CUDA kernel or a rerun
// draws the same mask (the keep test is kernels/dropout_math.h's, shared with the CUDA kernels of
// dropout.cu). Forward stores the mask as bytes for backward, on the workspace's device.
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
// The same on device pointers, enqueued on `stream` (dropout.cu; CUDA builds only). In backward a
// null keep_mask means p == 0: dx += dy. The mask's seed is *step_seed ^ salt, step_seed a device
// pointer (Workspace::device_dropout_seed).
void dropout_forward_cuda(float* y, uint8_t* keep_mask, const float* x, float p,
                          const uint64_t* step_seed, uint64_t salt, int64_t numel,
                          CudaStream stream);
void dropout_backward_cuda(float* dx, const float* dy, const uint8_t* keep_mask, float p,
                           int64_t numel, CudaStream stream);

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
  // A host copy of the last forward's mask; empty unless masked().
  std::vector<uint8_t> keep_mask() const;

 private:
  void check_wiring(const Workspace& ws) const;
  uint8_t* keep_mask_bytes() { return reinterpret_cast<uint8_t*>(keep_mask_.data()); }
  int64_t numel_;
  float p_;
  uint64_t salt_;
  bool masked_ = false;
  // [numel] bytes, 1 = kept, in float storage (Tensor holds floats) on the workspace's device;
  // valid when masked_.
  Tensor keep_mask_;
};

}  // namespace ft
