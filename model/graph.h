// The model as a flat, topologically ordered list of ops over named values (activations). model/
// builds it, fusion/ passes rewrite it, and the Executor runs it forward then backward in reverse.
// Each op owns what its backward needs (saved statistics, masks), written in forward.
// Thread safety: a Graph and its Workspace belong to one training thread.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/params.h"

namespace ft {

using ValueId = int;

struct Value {
  std::string name;
  Shape shape;
};

// Per-run buffers for every value and its gradient, plus the integer inputs of a batch.
struct Workspace {
  std::vector<Tensor> values;
  std::vector<Tensor> grads;
  std::vector<int32_t> tokens;   // GPT: input byte ids [B*T]
  std::vector<int32_t> targets;  // GPT: next-byte ids [B*T]; ResNet: class labels [B]
  bool training = true;          // dropout on, BatchNorm uses batch statistics
  uint64_t dropout_seed = 0;     // changes every step; masks are a pure function of it
  // Per value, set by the executor only for an op that overwrites_fresh_input_grads(): the
  // gradient buffer holds stale data, and that op's backward must write (=) all of it.
  std::vector<uint8_t> grad_fresh;

  bool grad_is_fresh(ValueId id) const {
    return static_cast<size_t>(id) < grad_fresh.size() && grad_fresh[id] != 0;
  }
};

class Op {
 public:
  virtual ~Op() = default;
  virtual const char* kind() const = 0;
  // Writes (=) every output value.
  virtual void forward(Workspace& ws, ParamStore& params) = 0;
  // Accumulates (+=) into the gradients of inputs and parameters, reading output gradients;
  // writes (=) instead into every input gradient that ws.grad_is_fresh(), if
  // overwrites_fresh_input_grads().
  virtual void backward(Workspace& ws, ParamStore& params) = 0;
  // True if backward honours ws.grad_fresh, writing every element of a fresh input gradient.
  // The executor then skips zeroing those buffers (and the op skips reading them), which saved
  // ~7% of a resnet20 step; ops that keep the default are handed zeroed buffers.
  virtual bool overwrites_fresh_input_grads() const { return false; }

  std::string name;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::vector<ParamId> params;  // every parameter the op reads; the executor tracks last use
};

struct Graph {
  std::vector<Value> values;
  std::vector<std::unique_ptr<Op>> ops;
  ValueId input = -1;   // ResNet: images [B, 1, H, W], filled by the caller; GPT reads ws.tokens
  ValueId output = -1;  // logits
  ValueId loss = -1;    // scalar [1]

  ValueId add_value(const std::string& name, const Shape& shape) {
    values.push_back({name, shape});
    return static_cast<ValueId>(values.size() - 1);
  }
  const Shape& shape(ValueId id) const { return values.at(id).shape; }

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
