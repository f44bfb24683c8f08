// Token + position embedding: x[b, t, :] = wte[tokens[b*T + t], :] + wpe[t, :].
// Inputs {} (token ids come from Workspace::tokens, [B*T]), outputs {x [B, T, C]},
// params {wte [V, C], wpe [T, C]}. wte is shared with the tied LM head, whose gradient adds to it.
// CUDA (embedding.cu): forward gathers with ws.device_tokens(). Backward is deterministic, with
// no atomics: stage() groups the rows by token on the host (embedding_rows_by_token, from
// ws.tokens) and uploads the grouping (through the workspace's pinned staging); one thread per
// (token, column) then adds that token's rows in ascending order, and one thread per (t, column)
// adds b = 0, 1,
// ..., the CPU loop's order, so dwte and dwpe come out bit-identical to the CPU's. Thread safety:
// an op instance belongs to one training thread.
#pragma once
#include <cstdint>
#include <vector>

#include "model/graph.h"

namespace ft {

// Throws ft::Error naming the first token outside [0, vocab).
void embedding_check_tokens(const int32_t* tokens, int64_t rows, int64_t vocab);
// REQUIRES: every token in [0, vocab) (checked).
void embedding_forward(float* x, const int32_t* tokens, const float* wte, const float* wpe,
                       int batch, int seq_len, int channels, int64_t vocab);
// dwte[token] += dx[b, t]; dwpe[t] += sum over b of dx[b, t].
void embedding_backward(float* dwte, float* dwpe, const float* dx, const int32_t* tokens, int batch,
                        int seq_len, int channels);

// The rows of each distinct token, for the CUDA backward, in a layout whose size depends only on
// (rows, vocab), so a captured CUDA graph can replay over any batch's table:
//   [ distinct | token ids d_0 < d_1 < ... (capacity) | starts (capacity + 1) | rows by token ]
// capacity = embedding_token_capacity(rows, vocab) >= distinct; slots past distinct are 0. Token
// d_k's rows, ascending, are rows[starts[k], starts[k + 1]). REQUIRES: tokens checked.
int64_t embedding_token_capacity(int64_t rows, int64_t vocab);
std::vector<int32_t> embedding_rows_by_token(const int32_t* tokens, int64_t rows, int64_t vocab);
// The same on device pointers, enqueued on `stream` (embedding.cu; CUDA builds only).
// rows_by_token: embedding_rows_by_token's table, on the device; capacity: its capacity (one
// block column per slot; slots past the table's distinct do nothing).
void embedding_forward_cuda(float* x, const int32_t* tokens, const float* wte, const float* wpe,
                            int batch, int seq_len, int channels, CudaStream stream);
void embedding_backward_cuda(float* dwte, float* dwpe, const float* dx,
                             const int32_t* rows_by_token, int capacity, int batch, int seq_len,
                             int channels, CudaStream stream);

class EmbeddingOp : public Op {
 public:
  EmbeddingOp(int batch, int seq_len, int channels);
  OpKind op_kind() const override { return OpKind::kEmbedding; }
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  // cuda: checks the tokens and uploads their grouping for backward (no host work is left in
  // forward and backward, so a CUDA graph can replay them).
  void stage(Workspace& ws, ParamStore& params) override;
  OpCost cost(const Graph& graph) const override;

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;
  void backward_cuda(Workspace& ws, ParamStore& params);
  int batch_, seq_len_, channels_;
  // cuda backward: embedding_rows_by_token of this batch, on the host and (int32 bits in float
  // storage) on the device.
  std::vector<int32_t> rows_by_token_;
  Tensor rows_by_token_on_device_;
};

}  // namespace ft
