#include "app/training/trainer.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "app/training/device_setup.h"
#include "comm/backend_choice.h"
#include "comm/startup.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/timer.h"
#include "fusion/multi_tensor.h"
#include "kernels/step_control.h"

namespace ft {
namespace {

OptimizerOptions optimizer_options(const OptimConfig& optim) {
  OptimizerOptions options;
  options.name = optim.name;
  options.beta1 = optim.beta1;
  options.beta2 = optim.beta2;
  options.eps = optim.eps;
  options.weight_decay = optim.weight_decay;
  options.momentum = optim.momentum;
  options.nesterov = optim.nesterov;
  return options;
}

GradSyncOptions grad_sync_options(const CommConfig& comm) {
  GradSyncOptions options;
  options.bucketing = comm.bucketing;
  options.bucket_mb = comm.bucket_mb;
  options.first_bucket_mb = comm.first_bucket_mb;
  options.bucket_view = comm.bucket_view;
  options.overlap = comm.overlap;
  options.reorder_buckets = comm.reorder_buckets;
  options.deterministic = comm.deterministic;
  options.single_rank_allreduce = comm.single_rank_allreduce;
  options.grad_dtype = comm_dtype_from_name(comm.grad_dtype);
  options.emulate.latency_us = comm.emulate.latency_us;
  options.emulate.bandwidth_gbps = comm.emulate.bandwidth_gbps;
  return options;
}

}  // namespace

Trainer::Trainer(const Config& config, Communicator* comm) : config_(config), comm_(comm) {
  const int rank = comm ? comm->rank() : 0;
  world_size_ = comm ? comm->size() : 1;
  const Device device = setup_device(config, comm ? comm->local_rank() : 0);
  task_ = make_task(config, rank, world_size_);
  task_->register_params(params_);
  params_.allocate(device);
  params_.initialize(config.train.seed);
  graphs_ = std::make_unique<GraphCache>(
      [this](int batch, GraphMode mode) { return task_->build_graph(batch, mode); }, params_,
      config.fusion);
  train_run_ = &graphs_->get(config.train.batch_size, GraphMode::kTrain);
  if (config.fusion.enabled && config.fusion.horizontal.multi_tensor)
    sweep_ = make_multi_tensor_sweep(params_);
  else
    sweep_ = make_per_tensor_sweep();
  optimizer_ = make_optimizer(optimizer_options(config.optim), params_, sweep_);
  schedule_ = LrSchedule{config.optim.lr, config.optim.min_lr, config.optim.warmup_steps,
                         config.train.steps};
  // GradSync exists only under mpirun; the NCCL communicator is set up over MPI too.
  FT_REQUIRE(!config.comm.single_rank_allreduce || comm != nullptr,
             "comm.single_rank_allreduce: true needs the job started under mpirun (even one rank: "
             "mpirun -np 1 fusiontrain train ...), since the gradient communicator is set up over "
             "MPI; or set comm.single_rank_allreduce: false");
  if (comm != nullptr) {
    comm->set_timeout_s(config.comm.timeout_s);
    check_same_config(*comm, flatten_config(config), config.source_path);
    broadcast_parameters(*comm, params_);
    Communicator* grad_comm = comm;
    const GradientBackendRequest request{config.train.device, config.comm.backend,
                                         config.comm.deterministic};
    if (choose_gradient_backend(request, *comm) == "nccl") {
      device_comm_ = make_device_communicator();
      grad_comm = device_comm_.get();
    }
    grad_sync_ = std::make_unique<GradSync>(*grad_comm, params_, executor().grad_ready_order(),
                                            grad_sync_options(config.comm), comm);
  }
  graph_steps_ = config.fusion.enabled && config.fusion.cuda_graph;
  if (graph_steps_) check_graph_steps_supported();
  if (!config.train.resume.empty()) load_checkpoint(config.train.resume);
}

Trainer::~Trainer() = default;

int64_t Trainer::items_per_step() const {
  return task_->items_per_batch() * config_.train.grad_accum * world_size_;
}

StepStats Trainer::train_step() {
  if (graph_steps_ && eager_steps_ >= kEagerStepsBeforeCapture) return graph_train_step();
  const double start_ms = now_ms();
  Workspace& ws = train_run_->workspace;
  Executor& executor = *train_run_->executor;
  const int micro_batches = config_.train.grad_accum;
  if (!grads_zeroed_) sweep_->zero(params_);
  grads_zeroed_ = false;
  // A skipped step must leave BatchNorm's running statistics as they were too: its forward
  // already folded the (possibly non-finite) batch statistics into them.
  const bool may_skip = config_.train.nan_policy == "skip_step";
  Tensor& buffers = params_.flat_buffers();
  if (may_skip && buffers.numel() > 0) {
    if (buffers_before_step_.numel() != buffers.numel())
      buffers_before_step_ = Tensor::empty(buffers.shape(), buffers.device());
    buffers_before_step_.copy_from(buffers);
  }
  StepStats stats;
  double loss_sum = 0.0;
  for (int micro = 0; micro < micro_batches; ++micro) {
    ws.dropout_seed = dropout_seed(micro);
    task_->next_train_batch(ws, train_run_->graph);
    executor.forward(ws);
    loss_sum += executor.loss(ws);
    if (grad_sync_) {
      grad_sync_->begin_backward(micro == micro_batches - 1);
      executor.backward(ws, [this](ParamId id) { grad_sync_->on_grad_ready(id); });
    } else {
      executor.backward(ws);
    }
  }
  const float grad_scale = 1.0f / static_cast<float>(world_size_ * micro_batches);
  if (grad_sync_) {
    grad_sync_->finish(grad_scale);
    stats.comm = grad_sync_->last_stats();
  } else if (micro_batches > 1) {
    sweep_->scale(params_, grad_scale);
  }
  // The global norm is computed whether or not optim.grad_clip clips.
  stats.grad_norm = grad_norm(params_, *sweep_);
  const float clip_scale = clip_grad_scale(stats.grad_norm, config_.optim.grad_clip);
  stats.lr = schedule_.at(step_);
  stats.loss = static_cast<float>(loss_sum / micro_batches);
  const bool locally_finite = std::isfinite(stats.loss) && std::isfinite(stats.grad_norm);
  if (any_rank_diverged(locally_finite)) {
    skip_diverged_step(stats, locally_finite);
  } else {
    // fusion.horizontal.multi_tensor on the CPU: the update applies the clip and leaves the
    // gradients zero, two passes fewer; elsewhere (the twin) a scale pass, and a zeroing pass
    // when the next step starts.
    grads_zeroed_ = sweep_->fold_into_next_update(params_, clip_scale);
    if (!grads_zeroed_ && clip_scale != 1.0f) sweep_->scale(params_, clip_scale);
    optimizer_->step(params_, stats.lr);
  }
  ++step_;
  ++eager_steps_;
  stats.step = step_;
  stats.step_ms = now_ms() - start_ms;
  stats.compute_ms = stats.step_ms - stats.comm.exposed_ms;
  return stats;
}

void Trainer::skip_diverged_step(StepStats& stats, bool locally_finite) {
  // Parameters and optimizer state stay those of the last good step.
  stats.skipped = true;
  // "nan", not the C library's "-nan" for a NaN with its sign bit set.
  auto number = [](float value) {
    std::ostringstream text;
    if (std::isnan(value))
      text << "nan";
    else
      text << value;
    return text.str();
  };
  std::ostringstream what;
  what << "step " << step_ + 1 << ": ";
  if (locally_finite)
    what << "the loss or gradient norm of another rank is not finite (here loss "
         << number(stats.loss) << ", gradient norm " << number(stats.grad_norm) << ")";
  else if (!std::isfinite(stats.loss))
    what << "loss is " << number(stats.loss) << " (gradient norm " << number(stats.grad_norm)
         << ")";
  else
    what << "gradient norm is " << number(stats.grad_norm) << " (loss " << number(stats.loss)
         << ")";
  // Every rank took the vote above, so every rank stops here, at the same step.
  if (config_.train.nan_policy != "skip_step")
    throw CollectiveError(detail::concat(
        what.str(), "; stopping the run (train.nan_policy: stop; skip_step skips such steps); ",
        last_checkpoint_text()));
  ++skipped_steps_;
  Tensor& buffers = params_.flat_buffers();
  if (buffers.numel() > 0) {  // BatchNorm's running statistics as they were before the step
    buffers.copy_from(buffers_before_step_);
    params_.mark_changed();
  }
  if (skipped_steps_ > config_.train.max_skipped_steps)
    throw CollectiveError(detail::concat(
        what.str(), "; stopping the run: ", skipped_steps_,
        " steps skipped, more than train.max_skipped_steps = ", config_.train.max_skipped_steps,
        "; ", last_checkpoint_text()));
}

uint64_t Trainer::dropout_seed(int micro) const {
  const int micro_batches = config_.train.grad_accum;
  return mix_u64(config_.train.seed ^
                 mix_u64(static_cast<uint64_t>(step_) * micro_batches + micro + 1));
}

bool Trainer::any_rank_diverged(bool locally_finite) {
  if (comm_ == nullptr) return !locally_finite;
  // The gradients are already reduced, but each rank's loss is its own: vote. One float, after
  // GradSync::finish, so it is in neither comm_ms nor exposed_ms (which cover the gradient
  // buckets only) but in compute_ms, with any wait for a slower rank it absorbs.
  float diverged = locally_finite ? 0.0f : 1.0f;
  comm_->allreduce(&diverged, 1, ReduceOp::kSum);
  return diverged != 0.0f;
}

EvalResult Trainer::evaluate(int max_batches) {
  return task_->evaluate(*graphs_, config_.train.batch_size, max_batches);
}

}  // namespace ft
