// The model as a flat, topologically ordered list of ops over named values (activations). model/
// builds it at eager granularity (one op per kernel PyTorch eager mode would launch), fusion/
// passes rewrite it, validate() checks it, and the Executor runs the frozen result forward then
// backward in reverse. Each op owns what its backward needs (saved statistics, masks).
// A value is either a root (its own contiguous buffer) or a strided column view of a root
// (rows x width inside a root whose rows are wider), which is how one fused QKV GEMM writes a
// [rows, 3C] buffer that three consumers read as q, k and v without a copy.
// Thread safety: a Graph and its Workspace belong to one training thread.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "model/params.h"

namespace ft {

using ValueId = int;

// Whether a graph is built for training (dropout masks, batch statistics, backward) or for
// evaluation (no dropout ops, running statistics, forward only). A property of the graph, never
// a flag an op reads at run time.
enum class GraphMode { kTrain, kEval };
const char* graph_mode_name(GraphMode mode);

// Typed op kinds: passes match on these, never on name strings.
enum class OpKind {
  // eager (built by model/)
  kEmbedding,
  kLayerNorm,
  kLinear,
  kGelu,
  kDropout,
  kResidualAdd,
  kAttentionScores,  // S = scale Q K^T per head
  kCausalSoftmax,    // P = softmax(S) over s <= t
  kAttentionMix,     // Y = P V per head
  kLmHead,
  kCrossEntropy,
  kConv2d,
  kBatchNorm,           // batch statistics (training)
  kBatchNormInference,  // running statistics (eval)
  kRelu,
  kGlobalAvgPool,
  kCast,  // fp32 -> bf16 copy of a GEMM operand (train.precision: bf16), as autocast launches
  // fused (built by fusion/ passes)
  kLinearGelu,
  kResidualLayerNorm,
  kClassifier,
  kFlashAttention,
  kBatchNormRelu,
  kBatchNormInferenceRelu,  // eval: running statistics + ReLU
  kAddRelu,
  kBatchNormAddRelu,  // train: BatchNorm (+ the shortcut's) + residual add + ReLU
  kQkvLinear,
  kBatchedLayerNorm,
  kConvShortcut,
  kConvBias,       // inference: convolution with BatchNorm folded in (+ ReLU)
  kLayerNormCast,  // LayerNorm writing its output in bf16 (train.precision: bf16)
  kGeluCast,       // GELU writing its output in bf16
  kReluCast,       // ReLU writing its output in bf16
  kOther,          // test and gradient-check helpers
};
const char* op_kind_name(OpKind kind);

// What `plan` prints per op. Bytes count each input, output and parameter once per pass.
struct OpCost {
  double forward_flops = 0, backward_flops = 0;
  double bytes_read = 0, bytes_written = 0;  // forward
  double saved_bytes = 0;  // buffers the op keeps from forward for backward (masks, statistics)
};

struct Value {
  std::string name;
  Shape shape;
  // Views: rows x width floats of root `view_of`, starting at column `column_offset` of each of
  // its rows (row stride = the root's last dimension). -1 for a root.
  ValueId view_of = -1;
  int64_t column_offset = 0;
  // False for values no gradient flows into (the images); they get no gradient buffer.
  bool needs_grad = true;
  // bf16 for the GEMM operands of train.precision: bf16 (a view has its root's). Gradients are
  // fp32 whatever the value's dtype: every gradient reduction and optimizer input stays fp32.
  DType dtype = DType::kF32;

  bool is_view() const { return view_of >= 0; }
};

// Per-run buffers for every value and its gradient, plus the integer inputs of a batch.
struct Workspace {
  // Where values and gradients live; each op runs the kernels of this device (core/device.h), on
  // `stream` when it is cuda (the compute stream of core/cuda/cuda_context.h).
  Device device = Device::kCpu;
  CudaStream stream = nullptr;
  std::vector<Tensor> values;        // a view's tensor starts at its first element; see row_stride
  std::vector<Tensor> grads;         // undefined for values with !needs_grad
  std::vector<int64_t> row_strides;  // per value, floats between rows: shape.back() for roots
  std::vector<int32_t> tokens;       // GPT: input byte ids [B*T]
  std::vector<int32_t> targets;      // GPT: next-byte ids [B*T]; ResNet: class labels [B]
  // cuda: tokens and targets copied to the device by Executor::forward, as int32 bit patterns in
  // float storage (Tensor holds floats); read them through device_tokens()/device_targets().
  Tensor tokens_on_device, targets_on_device;
  // cuda: page-locked host memory that batches pass through on their way to the device
  // (upload_to_workspace in model/executor.h), grown as needed.
  Tensor pinned_staging;
  uint64_t dropout_seed = 0;  // changes every step; masks are a pure function of it
  // cuda: dropout_seed on the device (its 8 bytes in two floats), so a replayed CUDA graph draws
  // each step's masks; read it through device_dropout_seed().
  Tensor dropout_seed_on_device;
  // Set by Executor::stage_inputs, cleared by the forward that follows: the batch is already on
  // the device, and forward must not stage it again (it may be being captured into a CUDA graph).
  bool inputs_staged = false;
  // Per value, set by the executor only for an op that overwrites_fresh_input_grads() (roots) or
  // overwrites_fresh_view_grads() (views): the gradient buffer holds stale data, and that op's
  // backward must write (=) all of it (a view: all of its columns).
  std::vector<uint8_t> grad_fresh;

  bool grad_is_fresh(ValueId id) const {
    return static_cast<size_t>(id) < grad_fresh.size() && grad_fresh[id] != 0;
  }
  int64_t row_stride(ValueId id) const { return row_strides.at(id); }
  const int32_t* device_tokens() const {
    return reinterpret_cast<const int32_t*>(tokens_on_device.data());
  }
  const int32_t* device_targets() const {
    return reinterpret_cast<const int32_t*>(targets_on_device.data());
  }
  const uint64_t* device_dropout_seed() const {
    return reinterpret_cast<const uint64_t*>(dropout_seed_on_device.data());
  }
};

class Graph;

class Op {
 public:
  virtual ~Op() = default;
  virtual OpKind op_kind() const = 0;
  const char* kind() const { return op_kind_name(op_kind()); }
  // Writes (=) every output value.
  virtual void forward(Workspace& ws, ParamStore& params) = 0;
  // Host work on this step's batch that forward and backward need, run by
  // Executor::stage_inputs before forward: checks of ws.tokens, tables derived from them and
  // uploaded to the device. Afterwards forward and backward only enqueue device work on cuda, so
  // a CUDA graph can capture and replay them. Default: nothing.
  virtual void stage(Workspace& ws, ParamStore& params) {
    static_cast<void>(ws);
    static_cast<void>(params);
  }
  // Accumulates (+=) into the gradients of inputs and parameters, reading output gradients;
  // writes (=) instead into every input gradient that ws.grad_is_fresh(), if
  // overwrites_fresh_input_grads(). Never called on an eval graph.
  virtual void backward(Workspace& ws, ParamStore& params) = 0;
  // True if backward honours ws.grad_fresh, writing every element of a fresh input gradient.
  // The executor then skips zeroing those buffers (and the op skips reading them), which saved
  // ~7% of a resnet20 step; ops that keep the default are handed zeroed buffers.
  virtual bool overwrites_fresh_input_grads() const { return false; }
  // True if backward, on `ws`'s path, also honours ws.grad_fresh on input views: the executor
  // hands an op the views of a root fresh (instead of zeroing the root) when that op reads the
  // root only through views that cover its columns once (flash attention over the QKV GEMM's q, k
  // and v), and the op then writes every element of each view's columns.
  virtual bool overwrites_fresh_view_grads(const Workspace& ws) const {
    static_cast<void>(ws);
    return false;
  }
  // True if the op reads its inputs and writes its outputs through ws.row_stride(), so they may
  // be column views. validate() rejects a view wired to an op that does not.
  virtual bool supports_views() const { return false; }
  // True if the op reads or writes bf16 values where a graph wires them (dispatching on the
  // value's dtype). validate() rejects a bf16 value wired to an op that does not.
  virtual bool handles_bf16() const { return false; }
  // FLOPs of forward and backward; the default counts none (data movement only).
  virtual OpCost cost(const Graph& graph) const;
  // What the op chose by measuring while it ran (e.g. model.conv_algorithm: measure), for the
  // profile to show; empty for ops that choose nothing at run time.
  virtual std::string runtime_choice() const { return {}; }

  std::string name;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<ParamId> params;  // every parameter the op reads
  int eager_ops = 1;            // ops of the eager graph this op stands for (fused ops: > 1)
  int eager_casts = 0;          // of those, the casts of train.precision bf16 (a CastOp: 1)
};

class Graph {
 public:
  std::vector<Value> values;
  std::vector<std::unique_ptr<Op>> ops;
  GraphMode mode = GraphMode::kTrain;
  ValueId input = -1;   // ResNet: images [B, 1, H, W], filled by the caller; GPT reads ws.tokens
  ValueId output = -1;  // logits
  ValueId loss = -1;    // scalar [1]

  ValueId add_value(const std::string& name, const Shape& shape, DType dtype = DType::kF32) {
    values.push_back({name, shape});
    values.back().dtype = dtype;
    return static_cast<ValueId>(values.size() - 1);
  }
  DType dtype(ValueId id) const { return values.at(id).dtype; }
  // Bytes of one element of `id`.
  double element_bytes(ValueId id) const {
    return static_cast<double>(dtype_size(values.at(id).dtype));
  }
  // A [rows, width] column view of `base` (a root or a view, which is resolved to its root)
  // starting at `column_offset`. REQUIRES: base's rows hold at least column_offset + width.
  ValueId add_view(const std::string& name, ValueId base, int64_t column_offset, int64_t width);
  const Shape& shape(ValueId id) const { return values.at(id).shape; }
  int64_t numel(ValueId id) const { return shape_numel(values.at(id).shape); }
  // Floats between consecutive rows of `id`: its own last dimension, or its root's.
  int64_t row_stride(ValueId id) const;

  // Appends an op built from `args`, wiring its name, inputs, outputs and params.
  template <typename OpType, typename... Args>
  OpType& add_op(std::string name, std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                 std::vector<ParamId> params, Args&&... args) {
    auto op = std::make_unique<OpType>(std::forward<Args>(args)...);
    op->name = std::move(name);
    op->inputs = std::move(inputs);
    op->outputs = std::move(outputs);
    op->params = std::move(params);
    OpType& ref = *op;
    ops.push_back(std::move(op));
    return ref;
  }
};

}  // namespace ft
