// Trainer's CUDA-graph step (fusion.cuda_graph): the limit of horizontal launch fusion. One step,
// captured once, becomes a single graph launch: zeroing, forward, backward with its NCCL bucket
// launches (forked onto the communication stream by events, joined back by the bucket waits),
// averaging, the gradient norm, the clip scale, the divergence vote and the optimizer.
//
// What a replay cannot take from its captured arguments lives in device memory: the batch, its
// token grouping and the dropout seed (Executor::stage_inputs, before each launch), and the
// step's scalars in a DeviceStepControl (kernels/step_control.h): the host writes the optimizer's
// constants for the coming step, the graph writes the loss, the norm, the clip scale and whether
// any rank diverged, and the host reads them back after the launch, the step's one
// synchronisation. The optimizer kernels skip a diverged step on the device, so a skipped replay
// changes no parameter; the host then restores BatchNorm's buffers as an eager step does.
// The result is the eager step's, bit for bit in exact arithmetic and in practice: the same
// kernels in the same order, the clip applied as the optimizer reads each gradient (x * 1.0f is
// x, and a clipped x * s is the same product either way).
#include <cmath>

#include "app/training/trainer.h"
#include "core/check.h"
#include "core/timer.h"
#include "kernels/step_control.h"

#if defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_context.h"
#include "core/cuda/cuda_graph.h"
#include "core/cuda/device_memory.h"
#endif

namespace ft {

#if defined(FT_HAVE_CUDA)

struct Trainer::GraphStep {
  // One DeviceStepControl each, in floats: on the device (what the graph reads and writes) and
  // its page-locked host copy (what the host writes before and reads after a launch).
  Tensor control_on_device, control_on_host;
  CommStepStats captured_comm;  // the bucket layout of the captured step; no times
  // Last, so it is destroyed first: its destructor waits for a replay in flight before the
  // control blocks it reads and writes go back to their allocators.
  CudaGraph graph;

  GraphStep() {
    const int64_t floats = (sizeof(DeviceStepControl) + sizeof(float) - 1) / sizeof(float);
    control_on_device = Tensor::zeros({floats}, Device::kCuda);
    control_on_host = Tensor::empty_pinned({floats});
    *host() = DeviceStepControl();
  }
  DeviceStepControl* device() {
    return reinterpret_cast<DeviceStepControl*>(control_on_device.data());
  }
  DeviceStepControl* host() { return reinterpret_cast<DeviceStepControl*>(control_on_host.data()); }
};

void Trainer::check_graph_steps_supported() const {
  // MPI reduces buckets on the host between the graph's kernels, which a graph cannot hold.
  FT_REQUIRE(!config_.comm.single_rank_allreduce || device_comm_ != nullptr,
             "fusion.cuda_graph: true with comm.single_rank_allreduce: true needs the gradients "
             "reduced by NCCL, but this run reduces them over MPI; set comm.backend: nccl, or "
             "comm.single_rank_allreduce: false");
  FT_REQUIRE(world_size_ == 1 || device_comm_ != nullptr,
             "fusion.cuda_graph: true needs the gradients reduced by NCCL when training on ",
             world_size_,
             " ranks, but this run reduces them over MPI (comm.backend mpi, comm.deterministic, or "
             "ranks sharing a GPU); use comm.backend: nccl with one GPU per rank, or set "
             "fusion.cuda_graph: false");
}

void Trainer::capture_graph_step() {
  GraphStep& step = *graph_step_;
  Workspace& ws = train_run_->workspace;
  Executor& executor = *train_run_->executor;
  const cudaStream_t stream = cuda_context().compute_stream();
  DeviceStepControl* control = step.device();
  const int64_t steps_taken = optimizer_->steps_taken();
  const bool may_skip = config_.train.nan_policy == "skip_step";
  Tensor& buffers = params_.flat_buffers();
  sweep_->set_device_control(control);
  step.graph.begin_capture(stream);
  try {
    sweep_->zero(params_);
    if (may_skip && buffers.numel() > 0) buffers_before_step_.copy_from(buffers);
    executor.forward(ws);  // the batch was staged before the capture
    if (grad_sync_) {
      grad_sync_->begin_backward(true);
      executor.backward(ws, [this](ParamId id) { grad_sync_->on_grad_ready(id); });
      grad_sync_->finish(1.0f / static_cast<float>(world_size_));
    } else {
      executor.backward(ws);
    }
    sweep_->square_sum_on_device(params_, &control->square_sum);
    finish_step_control_cuda(control, ws.values[train_run_->graph.loss].data(), stream);
    // Every rank skips when one diverged: sum the flags over NCCL (on one rank too when
    // comm.single_rank_allreduce asks for the real collectives).
    if (world_size_ > 1 || config_.comm.single_rank_allreduce) {
      std::unique_ptr<CommHandle> vote =
          device_comm_->allreduce_async(&control->diverged, 1, {ReduceOp::kSum});
      vote->wait();  // the compute stream waits; the host does not
    }
    optimizer_->step(params_, 0.0f);  // its constants come from the control
    step.graph.end_capture();
  } catch (...) {
    step.graph.abort_capture();
    sweep_->set_device_control(nullptr);
    optimizer_->set_steps_taken(steps_taken);
    throw;
  }
  sweep_->set_device_control(nullptr);       // the captured kernels hold the pointer already
  optimizer_->set_steps_taken(steps_taken);  // step() ran on the host only; replays count
  step.captured_comm = grad_sync_ ? grad_sync_->last_stats() : CommStepStats();
  step.captured_comm.comm_ms = step.captured_comm.exposed_ms = 0;
  step.captured_comm.bucket_timings.clear();
}

StepStats Trainer::graph_train_step() {
  const double start_ms = now_ms();
  if (!graph_step_) graph_step_.reset(new GraphStep());
  GraphStep& step = *graph_step_;
  Workspace& ws = train_run_->workspace;
  const cudaStream_t stream = cuda_context().compute_stream();
  StepStats stats;
  ws.dropout_seed = dropout_seed(0);  // the only micro-batch
  task_->next_train_batch(ws, train_run_->graph);
  train_run_->executor->stage_inputs(ws);
  stats.lr = schedule_.at(step_);
  DeviceStepControl& host = *step.host();
  host = DeviceStepControl();
  optimizer_->next_step_constants(stats.lr, &host);
  host.max_norm = config_.optim.grad_clip;
  cuda_copy(step.device(), &host, sizeof(DeviceStepControl), stream);
  if (!step.graph.captured()) capture_graph_step();
  step.graph.launch(stream);
  cuda_copy(&host, step.device(), sizeof(DeviceStepControl), stream);  // waits for the replay
  params_.mark_changed();  // BatchNorm's running statistics moved, and the parameters
  stats.loss = host.loss;
  stats.grad_norm = host.grad_norm;
  stats.comm = step.captured_comm;
  if (step_skipped(host)) {
    const bool locally_finite = std::isfinite(stats.loss) && std::isfinite(stats.grad_norm);
    skip_diverged_step(stats, locally_finite);
  } else {
    optimizer_->set_steps_taken(optimizer_->steps_taken() + 1);
  }
  ++step_;
  stats.step = step_;
  stats.step_ms = now_ms() - start_ms;
  stats.compute_ms = stats.step_ms;
  return stats;
}

#else  // no CUDA path: config validation already refused fusion.cuda_graph without a GPU

struct Trainer::GraphStep {};

void Trainer::check_graph_steps_supported() const {
  FT_FAIL("fusion.cuda_graph: true needs a build with the CUDA path");
}

void Trainer::capture_graph_step() {}

StepStats Trainer::graph_train_step() {
  FT_FAIL("fusion.cuda_graph: true needs a build with the CUDA path");
}

#endif  // defined(FT_HAVE_CUDA)

void Trainer::GraphStepDeleter::operator()(GraphStep* step) const {
  delete step;
}

}  // namespace ft
