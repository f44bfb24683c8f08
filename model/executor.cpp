#include "model/executor.h"

#include <algorithm>
#include <limits>

#include "core/capture_guard.h"
#include "core/check.h"
#include "core/denormals.h"

#if defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_context.h"
#endif

namespace ft {

namespace {

// The views of `root` that `reader` takes as inputs, when they cover the root's columns exactly
// once and the reader takes nothing else of it (not the root itself); otherwise none.
std::vector<ValueId> covering_views(const Graph& graph, ValueId root, const Op& reader) {
  std::vector<ValueId> views;
  for (ValueId id : reader.inputs) {
    if (id == root) return {};
    if (graph.values[id].view_of == root) views.push_back(id);
  }
  std::sort(views.begin(), views.end(), [&](ValueId a, ValueId b) {
    return graph.values[a].column_offset < graph.values[b].column_offset;
  });
  int64_t covered = 0;  // columns [0, covered) seen once, in order
  for (ValueId id : views) {
    if (graph.values[id].column_offset != covered) return {};
    covered += graph.values[id].shape.back();
  }
  if (covered != graph.values[root].shape.back()) return {};
  return views;
}

// True if no op but the one at `reader` reads `root` or any of its views.
bool only_reader(const Graph& graph, ValueId root, int reader) {
  for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index) {
    if (op_index == reader) continue;
    for (ValueId id : graph.ops[op_index]->inputs)
      if (id == root || graph.values[id].view_of == root) return false;
  }
  return true;
}

}  // namespace

Executor::Executor(const Graph& graph, ParamStore& params) : graph_(graph), params_(params) {
  FT_CHECK(params.allocated(), "executor built before parameters were allocated");
  FT_CHECK(graph.loss >= 0, "graph has no loss value");
  flush_denormals_to_zero();  // see core/denormals.h: the GELU and softmax tails
  // A gradient is final once backward has passed the earliest op that reads the parameter.
  std::vector<int> first_user(params.size(), -1);
  for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index)
    for (ParamId id : graph.ops[op_index]->params)
      if (first_user[id] < 0) first_user[id] = op_index;
  ready_after_op_.assign(graph.ops.size(), {});
  if (graph.mode == GraphMode::kTrain) {
    for (ParamId id = 0; id < params.size(); ++id) {
      if (!params[id].trainable) continue;
      FT_CHECK(first_user[id] >= 0, "parameter '", params[id].name, "' is used by no op");
      ready_after_op_[first_user[id]].push_back(id);
    }
  }
  for (int op_index = static_cast<int>(graph.ops.size()) - 1; op_index >= 0; --op_index)
    for (ParamId id : ready_after_op_[op_index]) grad_ready_order_.push_back(id);
  // An activation's gradient is first written by the backward of its last reader in forward
  // order, so it is zeroed just before that op runs backward: the zeroed lines are still in cache
  // when the op adds into them. Zeroing every gradient up front (about 100 MB in resnet20 at
  // batch 64) pushed them all out to memory first and cost ~6% of a step. A view's gradient is
  // part of its root's, so a root is zeroed before the last reader of it or of any of its views.
  const ValueId count = static_cast<ValueId>(graph.values.size());
  auto root_of = [&](ValueId id) {
    return graph.values[id].is_view() ? graph.values[id].view_of : id;
  };
  std::vector<int> last_reader(count, -1);
  std::vector<uint8_t> has_views(count, 0);
  for (ValueId id = 0; id < count; ++id)
    if (graph.values[id].is_view()) has_views[root_of(id)] = 1;
  for (int op_index = 0; op_index < static_cast<int>(graph.ops.size()); ++op_index)
    for (ValueId id : graph.ops[op_index]->inputs) last_reader[root_of(id)] = op_index;
  zero_before_op_.assign(graph.ops.size(), {});
  for (ValueId id = 0; id < count; ++id) {
    if (id == graph.loss || graph.values[id].is_view() || !needs_grad(id)) continue;
    if (last_reader[id] >= 0 && !has_views[id])
      zero_before_op_[last_reader[id]].push_back(id);
    else
      zero_at_start_.push_back(id);  // read through views, or read by no op
  }
  // Roots read through views: zeroed whole just before their first backward reader, or, when that
  // op is the only one and its views cover the root's columns once, handed to it as fresh views.
  zero_views_before_op_.assign(graph.ops.size(), {});
  fresh_views_before_op_.assign(graph.ops.size(), {});
  for (ValueId id = 0; id < count; ++id)
    if (has_views[id] && needs_grad(id) && last_reader[id] >= 0) {
      zero_at_start_.erase(std::remove(zero_at_start_.begin(), zero_at_start_.end(), id),
                           zero_at_start_.end());
      const int reader = last_reader[id];
      const std::vector<ValueId> views = covering_views(graph, id, *graph.ops[reader]);
      if (!views.empty() && only_reader(graph, id, reader))
        fresh_views_before_op_[reader].push_back({id, views});
      else
        zero_views_before_op_[reader].push_back(id);
    }
}

bool Executor::needs_grad(ValueId id) const {
  return graph_.mode == GraphMode::kTrain && graph_.values[id].needs_grad && id != graph_.input;
}

Workspace Executor::make_workspace() const {
  Workspace ws;
  const Device device = params_.device();
  ws.device = device;
#if defined(FT_HAVE_CUDA)
  if (device == Device::kCuda) ws.stream = cuda_context().compute_stream();
#endif
  const ValueId count = static_cast<ValueId>(graph_.values.size());
  ws.values.resize(count);
  ws.grads.resize(count);
  ws.row_strides.resize(count);
  for (ValueId id = 0; id < count; ++id) {
    const Value& value = graph_.values[id];
    ws.row_strides[id] = graph_.row_stride(id);
    if (value.is_view()) continue;
    ws.values[id] = Tensor::zeros(value.shape, device, value.dtype);
    if (needs_grad(id)) ws.grads[id] = Tensor::zeros(value.shape, device);
  }
  for (ValueId id = 0; id < count; ++id) {
    const Value& value = graph_.values[id];
    if (!value.is_view()) continue;
    Tensor& root = ws.values[value.view_of];
    ws.values[id] = value.dtype == DType::kBF16
                        ? Tensor::wrap(root.bf16_data() + value.column_offset, value.shape, device)
                        : Tensor::wrap(root.data() + value.column_offset, value.shape, device);
    if (needs_grad(value.view_of))
      ws.grads[id] =
          Tensor::wrap(ws.grads[value.view_of].data() + value.column_offset, value.shape, device);
  }
  return ws;
}

namespace {

// Copies an int32 host vector into `on_device` (reallocated when its length changed).
void upload_ids(Workspace& ws, Tensor& on_device, const std::vector<int32_t>& ids) {
  static_assert(sizeof(int32_t) == sizeof(float), "ids travel in float storage");
  const int64_t count = static_cast<int64_t>(ids.size());
  if (!on_device.defined() || on_device.numel() != count)
    on_device = Tensor::empty({count}, Device::kCuda);
  upload_to_workspace(ws, on_device, reinterpret_cast<const float*>(ids.data()), count);
}

}  // namespace

void upload_to_workspace(Workspace& ws, Tensor& destination, const float* host, int64_t count) {
  FT_CHECK(destination.numel() == count, "upload of ", count, " floats into ",
           shape_str(destination.shape()));
  if (count == 0) return;
  if (destination.device() == Device::kCpu) {
    std::copy(host, host + count, destination.data());
    return;
  }
  if (ws.pinned_staging.numel() < count) ws.pinned_staging = Tensor::empty_pinned({count});
  Tensor staged = ws.pinned_staging.rows(0, count);
  std::copy(host, host + count, staged.data());
  destination.copy_from(staged);
}

float Executor::loss(const Workspace& ws) const {
  require_not_capturing("Executor::loss (reading the loss on the host)");
  const Tensor& loss = ws.values[graph_.loss];
  if (loss.device() == Device::kCpu) return loss.data()[0];
  return loss.to_host_vector()[0];
}

void Executor::stage_inputs(Workspace& ws) {
  FT_CHECK(ws.device == params_.device(), "workspace on ", device_name(ws.device),
           ", parameters on ", device_name(params_.device()));
  if (ws.device == Device::kCuda) {
    upload_ids(ws, ws.tokens_on_device, ws.tokens);
    upload_ids(ws, ws.targets_on_device, ws.targets);
    static_assert(sizeof(uint64_t) == 2 * sizeof(float), "the seed travels in two floats");
    // numel, not defined(): a default Tensor (no storage, 0 elements) counts as defined.
    if (ws.dropout_seed_on_device.numel() != 2)
      ws.dropout_seed_on_device = Tensor::empty({2}, Device::kCuda);
    upload_to_workspace(ws, ws.dropout_seed_on_device,
                        reinterpret_cast<const float*>(&ws.dropout_seed), 2);
  }
  for (const auto& op : graph_.ops) op->stage(ws, params_);
  ws.inputs_staged = true;
}

void Executor::forward(Workspace& ws) {
  if (!ws.inputs_staged) stage_inputs(ws);
  ws.inputs_staged = false;
  // A train forward updates BatchNorm running statistics.
  if (graph_.mode == GraphMode::kTrain) params_.mark_buffers_changed();
  // The unfused twin of an optimizer that writes the bf16 weight copies: one cast sweep.
  if (params_.bf16_copies_stale()) params_.refresh_bf16_copies();
  const bool timed = profiling_ || observer_ != nullptr;
  for (int op_index = 0; op_index < static_cast<int>(graph_.ops.size()); ++op_index) {
    const Op& op = *graph_.ops[op_index];
    const double start = timed ? now_ms() : 0.0;
    graph_.ops[op_index]->forward(ws, params_);
    if (!timed) continue;
    const double end = now_ms();
    if (profiling_) op_times_.add(std::string(op.kind()) + ".forward", end - start);
    if (observer_) observer_->on_op(op, op_index, false, start, end);
  }
}

void Executor::backward(Workspace& ws, const GradReadyFn& on_grad_ready) {
  FT_CHECK(graph_.mode == GraphMode::kTrain, "backward called on an eval graph");
  ws.grad_fresh.assign(ws.grads.size(), 0);
  for (ValueId id : zero_at_start_) ws.grads[id].fill(0.0f);
  ws.grads[graph_.loss].fill(1.0f);
  for (int op_index = static_cast<int>(graph_.ops.size()) - 1; op_index >= 0; --op_index) {
    Op& op = *graph_.ops[op_index];
    const bool timed = profiling_ || observer_ != nullptr;
    const double start = timed ? now_ms() : 0.0;
    const bool overwrites = fresh_gradients_ && op.overwrites_fresh_input_grads();
    for (ValueId id : zero_views_before_op_[op_index]) ws.grads[id].fill(0.0f);
    const bool overwrites_views = fresh_gradients_ && op.overwrites_fresh_view_grads(ws);
    for (const ViewedRoot& viewed : fresh_views_before_op_[op_index]) {
      if (!overwrites_views) {
        ws.grads[viewed.root].fill(0.0f);
        continue;
      }
      for (ValueId view : viewed.views) ws.grad_fresh[view] = 1;
      if (poison_fresh_) ws.grads[viewed.root].fill(std::numeric_limits<float>::quiet_NaN());
    }
    for (ValueId id : zero_before_op_[op_index]) {
      if (overwrites) {
        ws.grad_fresh[id] = 1;
        if (poison_fresh_) ws.grads[id].fill(std::numeric_limits<float>::quiet_NaN());
      } else
        ws.grads[id].fill(0.0f);
    }
    op.backward(ws, params_);
    for (ValueId id : zero_before_op_[op_index]) ws.grad_fresh[id] = 0;
    for (const ViewedRoot& viewed : fresh_views_before_op_[op_index])
      for (ValueId view : viewed.views) ws.grad_fresh[view] = 0;
    if (timed) {
      const double end = now_ms();
      if (profiling_) op_times_.add(std::string(op.kind()) + ".backward", end - start);
      if (observer_) observer_->on_op(op, op_index, true, start, end);
    }
    if (on_grad_ready)
      for (ParamId id : ready_after_op_[op_index]) on_grad_ready(id);
  }
}

}  // namespace ft
