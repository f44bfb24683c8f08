// Executor: runs a Graph forward, then backward in reverse op order, and announces each trainable
// parameter's gradient the moment it is final (after the backward of its first user in forward
// order, which handles tied weights such as wte). Data parallelism hangs its buckets on that call.
// Thread safety: one thread drives an Executor; the ready callback runs on that thread.
#pragma once
#include <functional>
#include <vector>

#include "core/timer.h"
#include "model/graph.h"

namespace ft {

using GradReadyFn = std::function<void(ParamId)>;

// Sees every op the executor runs, with wall-clock start and end (core/timer.h now_ms()): the
// profiler and the timeline trace hang on this. Called on the executor's thread.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void on_op(const Op& op, int op_index, bool backward, double start_ms, double end_ms) = 0;
};

// Copies `count` host floats into `destination` (a workspace tensor on any device). On cuda they
// go through ws.pinned_staging, so the copy runs at full bus speed.
void upload_to_workspace(Workspace& ws, Tensor& destination, const float* host, int64_t count);

class Executor {
 public:
  // REQUIRES: params allocated; graph and params outlive the executor; the graph is final (every
  // fusion pass has run): the tables below are derived from it once.
  Executor(const Graph& graph, ParamStore& params);

  // Buffers for every root value and its gradient (views share their root's), on the parameters'
  // device; eval graphs and values that need no gradient get no gradient buffer.
  Workspace make_workspace() const;

  // Copies the batch in ws (tokens, targets, the step's dropout seed) to the device and runs every
  // op's stage() on it. forward() does this itself unless it was done since the last forward; a
  // CUDA-graph step does it before each replay, outside the graph.
  void stage_inputs(Workspace& ws);
  void forward(Workspace& ws);
  // Seeds d(loss) = 1 and runs backward ops in reverse. Each activation gradient is first written
  // by the backward of its last reader in forward order: just before that op runs, the gradient
  // is zeroed, or marked fresh (ws.grad_fresh) for an op that overwrites_fresh_input_grads(). A
  // root read only through views is zeroed whole, unless one op reads it, through views covering
  // its columns once, and overwrites_fresh_view_grads(): then those views are marked fresh.
  // Parameter gradients accumulate (+=): the caller zeroes them once per optimizer step. REQUIRES:
  // a train graph (eval graphs have no backward).
  void backward(Workspace& ws, const GradReadyFn& on_grad_ready = nullptr);

  // The loss scalar, copied to the host when the workspace is on cuda (waits for the step).
  float loss(const Workspace& ws) const;

  // Trainable params in the order their gradients become final in backward.
  const std::vector<ParamId>& grad_ready_order() const { return grad_ready_order_; }

  void set_profiling(bool on) { profiling_ = on; }
  // REQUIRES: `observer` outlives its use; null detaches.
  void set_observer(OpObserver* observer) { observer_ = observer; }
  // Off: every activation gradient is zeroed and every op accumulates, the reference that tests
  // compare the default (ops that can overwrite a fresh gradient do) against.
  void set_fresh_gradients(bool on) { fresh_gradients_ = on; }
  // For tests: fill every gradient handed out as fresh with NaN first, so an op that claims to
  // overwrite it but leaves some element unwritten poisons the result instead of passing.
  void set_poison_fresh_gradients(bool on) { poison_fresh_ = on; }
  TimeTable& op_times() { return op_times_; }
  const Graph& graph() const { return graph_; }

 private:
  bool needs_grad(ValueId id) const;

  const Graph& graph_;
  ParamStore& params_;
  std::vector<std::vector<ParamId>> ready_after_op_;  // per op index
  std::vector<ParamId> grad_ready_order_;
  std::vector<std::vector<ValueId>> zero_before_op_;  // per op index: input grads it writes first
  std::vector<std::vector<ValueId>> zero_views_before_op_;  // roots read through views
  // Per op index: roots it reads only through views covering their columns once; handed out as
  // fresh views when the op overwrites_fresh_view_grads(), zeroed otherwise.
  struct ViewedRoot {
    ValueId root;
    std::vector<ValueId> views;
  };
  std::vector<std::vector<ViewedRoot>> fresh_views_before_op_;
  std::vector<ValueId> zero_at_start_;  // grads no op writes
  bool profiling_ = false;
  OpObserver* observer_ = nullptr;
  bool fresh_gradients_ = true;
  bool poison_fresh_ = false;
  TimeTable op_times_;
};

}  // namespace ft
