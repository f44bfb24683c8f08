// Vertical fusion of the tied LM head and the softmax cross-entropy, llm.c's fused classifier:
//   logits[rows, V] = x[rows, C] · wte[V, C]^T
//   loss = mean over rows of logsumexp(logits[row]) - logits[row][target[row]]
// The unfused twin is TiedLmHeadOp (model/ops/lm_head.h) -> SoftmaxCrossEntropyOp
// (model/ops/cross_entropy.h); fusion/classifier_pass.cpp builds this op and
// tests/fusion_classifier_test.cpp checks the two agree.
// The loss is the graph's only seed (d loss = 1 arrives from the executor), so the logits'
// gradient is known at forward time: forward walks row blocks of `tile_rows`, and for each block
// runs the logits GEMM, the softmax and loss, and writes
//   dlogits = (softmax(logits) - onehot(target)) / rows
// while the block is in cache. No probability tensor is stored. Backward scales by the incoming
// d loss inside the GEMMs:
//   dx (+|=) dloss · dlogits wte,   dwte += dloss · dlogits^T x   (added to the embedding's share).
// The eval form computes the loss only and saves nothing.
// Inputs {x [rows, C]}, outputs {logits [rows, V], loss [1]} (logits stay an output for accuracy
// and sampling), params {wte}; targets come from Workspace::targets.
// Thread safety: an op instance belongs to one training thread; rows of a block run on OpenMP.
#pragma once
#include <cstdint>

#include "core/gemm.h"
#include "core/tensor.h"
#include "model/graph.h"

namespace ft {

// Whether forward also writes the logits' gradient; fixed when the pass builds the op from the
// graph's mode.
enum class ClassifierForward {
  kLossAndDlogits,  // training
  kLossOnly,        // evaluation: no backward follows
};

// Writes logits [rows, V] and, unless `dlogits` is null, dlogits [rows, V] as above; returns the
// mean loss (accumulated in double). REQUIRES: every target in [0, vocab) (checked).
float classifier_forward(float* logits, float* dlogits, GemmOperand x, GemmOperand wte,
                         const int32_t* targets, int64_t rows, int64_t channels, int64_t vocab,
                         int tile_rows);
// dx (+= or, with overwrite_dx, =) dloss · dlogits wte; dwte += dloss · dlogits^T x.
// x and wte are fp32, or both bf16 (x a bf16 value, wte its bf16 copy: train.precision bf16).
void classifier_backward(float* dx, bool overwrite_dx, float* dwte, float dloss,
                         const float* dlogits, GemmOperand x, GemmOperand wte, int64_t rows,
                         int64_t channels, int64_t vocab);

// The same on device pointers, enqueued on `stream` (classifier.cu; CUDA builds only). Forward
// runs one logits GEMM over all rows (`tile_rows` is a CPU cache block; the GPU streams the
// logits through L2 either way), then one block per row: the online softmax of
// kernels/online_softmax.h, the row's loss into row_losses [rows] and, unless `dlogits` is
// null, its dlogits; then mean_row_losses_cuda (model/ops/cross_entropy.h) writes loss[0].
// Backward reads d loss from the device (`dloss`), so it cannot be a GEMM's host alpha: dwte +=
// dlogits^T (dloss x) and dx (+|=) dloss (dlogits wte) go through `scratch` [rows, C].
// Forward takes x and wte fp32, or both bf16 (train.precision: bf16).
// REQUIRES: targets checked on the host (check_class_targets).
void classifier_forward_cuda(float* loss, float* logits, float* dlogits, float* row_losses,
                             GemmOperand x, GemmOperand wte, const int32_t* targets, int64_t rows,
                             int64_t channels, int64_t vocab, CudaStream stream);
void classifier_backward_cuda(float* dx, bool overwrite_dx, float* dwte, float* scratch,
                              const float* dloss, const float* dlogits, const float* x,
                              const float* wte, int64_t rows, int64_t channels, int64_t vocab,
                              CudaStream stream);
// Backward with bf16 x and wte: the GEMMs' other operand is dloss · dlogits rounded to bf16 once
// into `dlogits_bf16` [rows, V], so no [rows, C] scratch is needed (the fp32 path scales x by the
// device dloss instead). The CPU rounds dlogits and multiplies by dloss in the GEMMs' alpha; the
// two are the same bits for dloss = 1, which is every training step's seed.
void classifier_backward_bf16_cuda(float* dx, bool overwrite_dx, float* dwte,
                                   bf16_bits* dlogits_bf16, const float* dloss,
                                   const float* dlogits, const bf16_bits* x, const bf16_bits* wte,
                                   int64_t rows, int64_t channels, int64_t vocab,
                                   CudaStream stream);

// Bytes the logits path holds at its peak in a training step: eager, logits + probabilities +
// the logits' gradient; fused, logits + dlogits. (Eval: logits + probabilities, and logits.)
double classifier_logits_path_bytes(int64_t rows, int64_t vocab, bool fused, GraphMode mode);

class ClassifierOp : public Op {
 public:
  // REQUIRES: rows, channels, vocab, tile_rows > 0.
  ClassifierOp(int64_t rows, int64_t channels, int64_t vocab, int tile_rows,
               ClassifierForward forward_kind = ClassifierForward::kLossAndDlogits);
  OpKind op_kind() const override { return OpKind::kClassifier; }
  // cuda: checks ws.targets on the host, which the kernels index with through their device copy.
  void stage(Workspace& ws, ParamStore& params) override;
  void forward(Workspace& ws, ParamStore& params) override;
  void backward(Workspace& ws, ParamStore& params) override;
  bool overwrites_fresh_input_grads() const override { return true; }
  bool handles_bf16() const override { return true; }
  OpCost cost(const Graph& graph) const override;

  int64_t rows() const { return rows_; }
  int64_t channels() const { return channels_; }
  int64_t vocab() const { return vocab_; }
  int tile_rows() const { return tile_rows_; }
  ClassifierForward forward_kind() const { return forward_kind_; }
  // d loss / d logits of the last training forward, for d loss = 1, [rows, V].
  const Tensor& dlogits() const { return dlogits_; }

 private:
  void check_wiring(const Workspace& ws, const ParamStore& params) const;

  int64_t rows_, channels_, vocab_;
  int tile_rows_;
  ClassifierForward forward_kind_;
  Tensor dlogits_;       // saved by a training forward, on the workspace's device
  Tensor row_losses_;    // cuda only: [rows], reduced to the mean by one block
  Tensor scratch_;       // cuda fp32 only: [rows, C] for backward
  Tensor dlogits_bf16_;  // cuda bf16 only: [rows, V], dloss · dlogits rounded for backward
};

}  // namespace ft
