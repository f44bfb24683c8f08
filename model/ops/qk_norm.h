// QK-norm: LayerNorm over head_dim applied to every head's query slice and every head's key slice
// of a fused qkv activation, before attention. One (weight, bias) pair of size head_dim is shared
// by all query heads, another by all key heads; the value slices are copied unchanged.
// Inputs {qkv [B, T, 3C]}, outputs {qkv_normed [B, T, 3C]},
// params {q_norm.weight, q_norm.bias, k_norm.weight, k_norm.bias} (each [head_dim]).
// Thread safety: an op instance belongs to one training thread.
#pragma once
#include <cstdint>
#include <vector>

#include "model/graph.h"

namespace ft {

class QkNormOp : public Op {
 public:
  QkNormOp(int batch, int seq_len, int channels, int n_head);
  OpKind op_kind() const override { return OpKind::kBatchedLayerNorm; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  int64_t tokens_;  // B * T
  int channels_, n_head_, head_dim_;
  // Per (token, head) statistics, [B*T*NH]: index token * NH + head.
  std::vector<float> q_mean_, q_rstd_, k_mean_, k_rstd_;
};

}  // namespace ft
