#include "model/executor.h"

#include "core/check.h"

namespace ft {

Executor::Executor(Graph& graph, ParamStore& params) : graph_(graph), params_(params) {
  FT_CHECK(params.allocated(), "executor built before parameters were allocated");
  FT_CHECK(graph.loss >= 0, "graph has no loss value");
  // A gradient is final once backward has passed the earliest op that reads the parameter.
  std::vector<int> first_user(params.size(), -1);
  for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index)
    for (ParamId id : graph.ops[op_index]->params)
      if (first_user[id] < 0) first_user[id] = op_index;
  ready_after_op_.assign(graph.ops.size(), {});
  for (ParamId id = 0; id < params.size(); ++id) {
    if (!params[id].trainable) continue;
    FT_CHECK(first_user[id] >= 0, "parameter '", params[id].name, "' is used by no op");
    ready_after_op_[first_user[id]].push_back(id);
  }
  for (int op_index = static_cast<int>(graph.ops.size()) - 1; op_index >= 0; --op_index)
    for (ParamId id : ready_after_op_[op_index]) grad_ready_order_.push_back(id);
}

Workspace Executor::make_workspace() const {
  Workspace ws;
  for (const Value& value : graph_.values) {
    ws.values.push_back(Tensor::zeros(value.shape));
    ws.grads.push_back(Tensor::zeros(value.shape));
  }
  return ws;
}

void Executor::forward(Workspace& ws) {
  for (auto& op : graph_.ops) {
    const double start = profiling_ ? now_ms() : 0.0;
    op->forward(ws, params_);
    if (profiling_) op_times_.add(std::string(op->kind()) + ".forward", now_ms() - start);
  }
}

void Executor::backward(Workspace& ws, const GradReadyFn& on_grad_ready) {
  for (Tensor& grad : ws.grads) grad.fill(0.0f);
  ws.grads[graph_.loss].fill(1.0f);
  for (int op_index = static_cast<int>(graph_.ops.size()) - 1; op_index >= 0; --op_index) {
    Op& op = *graph_.ops[op_index];
    const double start = profiling_ ? now_ms() : 0.0;
    op.backward(ws, params_);
    if (profiling_) op_times_.add(std::string(op.kind()) + ".backward", now_ms() - start);
    if (on_grad_ready)
      for (ParamId id : ready_after_op_[op_index]) on_grad_ready(id);
  }
}

}  // namespace ft
