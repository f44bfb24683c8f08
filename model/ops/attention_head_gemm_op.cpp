#include "model/ops/attention_head_gemm_op.h"

#include "kernels/attention_heads.h"

namespace ft {

AttentionHeadGemmOp::AttentionHeadGemmOp(const char* who, int batch, int seq_len, int channels,
                                         int n_head)
    : batch_(batch), seq_len_(seq_len), channels_(channels), n_head_(n_head) {
  check_attention_shape(who, batch, seq_len, channels, n_head);
}

OpCost AttentionHeadGemmOp::cost(const Graph& graph) const {
  OpCost cost = Op::cost(graph);
  const double macs = attention_head_macs(batch_, seq_len_, channels_, n_head_);
  cost.forward_flops = 2 * macs;
  cost.backward_flops = 4 * macs;
  return cost;
}

}  // namespace ft
