#include "comm/grad_sync.h"

#include <algorithm>
#include <cstring>

#include "comm/grad_cast.h"
#include "comm/startup.h"
#include "core/bf16_cast.h"  // store_row_bf16: serial, no OpenMP team on the comm thread
#include "core/check.h"
#include "core/timer.h"

#if defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_context.h"
#include "core/cuda/device_memory.h"
#endif

namespace ft {

GradSync::GradSync(Communicator& comm, ParamStore& params, std::vector<ParamId> ready_order,
                   GradSyncOptions options, Communicator* host_comm)
    : comm_(comm),
      host_comm_(host_comm != nullptr ? *host_comm : comm),
      params_(params),
      options_(options) {
  FT_CHECK(host_comm_.buffer_device() == Device::kCpu && host_comm_.size() == comm.size(),
           "GradSync's host communicator must reduce host memory over the same ranks");
  FT_CHECK(params.allocated(), "GradSync needs an allocated ParamStore");
  const Device grads_device = params.flat_grads().device();
  device_grads_ = grads_device == Device::kCuda;
  device_comm_ = comm.buffer_device() == Device::kCuda;
  // A device backend with host gradients is only tests/grad_sync_stream_test.cpp's fake stream
  // communicator, which checks the launch and wait order of the device path on the CPU.
  FT_CHECK(!options.bucketing || (options.bucket_mb > 0 && options.first_bucket_mb > 0),
           "bucket_mb and first_bucket_mb must be > 0, got ", options.bucket_mb, " and ",
           options.first_bucket_mb);
  FT_CHECK(options.emulate.latency_us >= 0 && options.emulate.bandwidth_gbps >= 0,
           "emulated link latency_us and bandwidth_gbps must be >= 0, got ",
           options.emulate.latency_us, " and ", options.emulate.bandwidth_gbps);
  build_buckets(ready_order);
  const bool host_staged = device_grads_ && !device_comm_;  // cuda gradients over MPI
  if (reduces() && host_staged)
    staging_ = Tensor::empty_pinned({params.num_trainable_floats()});
  else if (reduces() && !options.bucket_view && !bf16())
    staging_ = Tensor::empty({params.num_trainable_floats()}, grads_device);
  if (reduces() && bf16()) allocate_wire();
  // NCCL collectives are asynchronous on their own stream already; MPI needs a thread to overlap.
  if (reduces() && options.overlap && !device_comm_) comm_thread_ = std::make_unique<CommThread>();
  handles_.resize(0);
  check_same_layout_on_all_ranks();
}

GradSync::~GradSync() = default;

void GradSync::allocate_wire() {
  const int64_t count = params_.num_trainable_floats();
  if (device_grads_ && device_comm_) {
#if defined(FT_HAVE_CUDA)
    wire_device_ = std::shared_ptr<void>(cuda_malloc(static_cast<size_t>(count) * 2), cuda_free);
    wire_ = static_cast<bf16_bits*>(wire_device_.get());
#else
    FT_FAIL("device gradients in a build without CUDA");
#endif
    return;
  }
  wire_host_.assign(static_cast<size_t>(count), 0);
  wire_ = wire_host_.data();
}

void GradSync::build_buckets(const std::vector<ParamId>& order) {
  buckets_ = options_.bucketing
                 ? assign_buckets(params_, order, options_.bucket_mb, options_.first_bucket_mb)
                 : single_param_buckets(params_, order);
  bucket_of_param_.assign(static_cast<size_t>(params_.size()), -1);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (ParamId id : buckets_[b].params) bucket_of_param_[id] = static_cast<int>(b);
  }
  pending_params_.assign(buckets_.size(), 0);
  tickets_.assign(buckets_.size(), 0);
  handles_.clear();
  handles_.resize(buckets_.size());
  bucket_comm_ms_.assign(buckets_.size(), 0.0);
  bucket_start_ms_.assign(buckets_.size(), 0.0);
  timings_.assign(buckets_.size(), BucketTiming());
  announced_.assign(static_cast<size_t>(params_.size()), false);
}

void GradSync::check_same_layout_on_all_ranks() {
  if (same_on_all_ranks(host_comm_, bucket_signature(buckets_))) return;
  FT_FAIL("gradient buckets differ across ranks (rank ", comm_.rank(), " has ", buckets_.size(),
          " buckets): every rank must build the same model with the same bucket options");
}

void GradSync::set_record_timings(bool on) {
  FT_CHECK(!in_backward_, "set_record_timings inside begin_backward() ... finish()");
  record_timings_ = on;
}

void GradSync::begin_backward(bool communicate) {
  FT_CHECK(!(in_backward_ && communicating_),
           "begin_backward called again before finish() of a communicating backward");
  in_backward_ = true;
  communicating_ = communicate;
  next_launch_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_params_[b] = static_cast<int>(buckets_[b].params.size());
    tickets_[b] = 0;
    bucket_comm_ms_[b] = 0.0;
    bucket_start_ms_[b] = 0.0;
  }
  announced_.assign(announced_.size(), false);
  observed_order_.clear();
}

void GradSync::on_grad_ready(ParamId id) {
  FT_CHECK(in_backward_, "on_grad_ready outside begin_backward() ... finish()");
  FT_CHECK(id >= 0 && id < params_.size() && bucket_of_param_[id] >= 0,
           "on_grad_ready for param id ", id, ", which is not a trainable parameter");
  if (!communicating_) return;
  FT_CHECK(!announced_[id], "gradient of '", params_[id].name, "' announced twice in a backward");
  announced_[id] = true;
  if (options_.reorder_buckets && !reordered_) observed_order_.push_back(id);
  --pending_params_[bucket_of_param_[id]];
  if (options_.overlap) launch_ready_buckets();
}

void GradSync::launch_ready_buckets() {
  const int count = static_cast<int>(buckets_.size());
  while (next_launch_ < count && pending_params_[next_launch_] == 0) launch(next_launch_++);
}

void GradSync::launch(int bucket) {
  if (record_timings_) timings_[bucket].launch_ms = now_ms();
  if (device_comm_) {
    launch_on_device(bucket);
  } else if (comm_thread_) {
    tickets_[bucket] = comm_thread_->submit([this, bucket] { run_bucket(bucket); });
  } else {
    run_bucket(bucket);
  }
}

// Runs on whichever thread reduces the bucket; finish() reads the times after wait(), whose mutex
// orders these writes before that read.
void GradSync::run_bucket(int bucket) {
  if (!record_timings_) {
    reduce_bucket(bucket);
    return;
  }
  timings_[bucket].start_ms = now_ms();
  reduce_bucket(bucket);
  timings_[bucket].done_ms = now_ms();
}

// The NCCL path: the communicator orders the reduction after the work already on the compute
// stream (the kernels that made this bucket's gradients) with an event, and runs it on the
// communication stream; finish() makes the compute stream wait for it. Nothing blocks the host.
void GradSync::launch_on_device(int bucket) {
  if (!reduces()) return;
  const Bucket& range = buckets_[bucket];
  float* data = params_.flat_grads().data() + range.offset;
  if (bf16()) {
    bf16_bits* wire = wire_ + range.offset;
#if defined(FT_HAVE_CUDA)
    if (device_grads_) cuda_cast_to_bf16(wire, data, range.count, cuda_context().compute_stream());
#endif
    if (!device_grads_) store_row_bf16(wire, data, range.count);  // the tests' fake device backend
    handles_[bucket] = comm_.allreduce_bf16_async(wire, static_cast<size_t>(range.count),
                                                  {ReduceOp::kSum, Summation::kNative});
    return;
  }
  if (staging_.defined() && staging_.numel() > 0) {
    Tensor staged = staging_.rows(range.offset, range.offset + range.count);
    staged.copy_from(params_.flat_grads().rows(range.offset, range.offset + range.count));
    data = staged.data();
  }
  handles_[bucket] = comm_.allreduce_async(data, static_cast<size_t>(range.count),
                                           {ReduceOp::kSum, Summation::kNative});
}

void GradSync::reduce_bucket(int bucket) {
  if (!reduces()) return;
  // The copy-in belongs to communication too (it exists only to feed the allreduce), so comm_ms
  // covers all of what finish() may wait for; see CommStepStats.
  const double start_ms = now_ms();
  bucket_start_ms_[bucket] = start_ms;
  const Bucket& range = buckets_[bucket];
  Tensor grads = params_.flat_grads().rows(range.offset, range.offset + range.count);
  float* data = grads.data();
  const bool host_staged = device_grads_;  // device gradients over a host backend
  if (staging_.defined() && staging_.numel() > 0) {
    Tensor staged = staging_.rows(range.offset, range.offset + range.count);
    staged.copy_from(grads);  // returns once a device-to-host copy is done
    data = staged.data();
  }
  const Summation summation = options_.deterministic ? Summation::kRankOrder : Summation::kNative;
  const size_t count = static_cast<size_t>(range.count);
  if (bf16()) {
    bf16_bits* wire = wire_ + range.offset;
    store_row_bf16(wire, data, range.count);
    comm_.allreduce_bf16(wire, count, {ReduceOp::kSum, summation});
    // Host-staged device gradients widen here, to go back unscaled; host ones in scale_bucket.
    if (host_staged) cast_from_bf16_scaled(data, wire, range.count, 1.0f);
  } else {
    comm_.allreduce(data, count, {ReduceOp::kSum, summation});
  }
  emulate_link_delay(options_.emulate, wire_bytes(bucket), now_ms());
  // Back onto the device unscaled; finish() scales there like every other path.
  if (host_staged) grads.copy_from(staging_.rows(range.offset, range.offset + range.count));
  bucket_comm_ms_[bucket] = now_ms() - start_ms;
}

void GradSync::scale_bucket(int bucket, float scale) {
  const Bucket& range = buckets_[bucket];
  float* grads = params_.flat_grads().data() + range.offset;
#if defined(FT_HAVE_CUDA)
  if (device_grads_) {
    const cudaStream_t stream = cuda_context().compute_stream();
    if (device_comm_ && bf16() && reduces())
      cuda_cast_from_bf16_scaled(grads, wire_ + range.offset, range.count, scale, stream);
    else if (device_comm_ && staging_.defined() && staging_.numel() > 0)
      cuda_scaled_copy(grads, staging_.data() + range.offset, range.count, scale, stream);
    else
      cuda_scale(grads, range.count, scale, stream);
    return;
  }
#endif
  if (reduces() && bf16()) {
    cast_from_bf16_scaled(grads, wire_ + range.offset, range.count, scale);
  } else if (reduces() && !options_.bucket_view) {
    const float* staged = staging_.data() + range.offset;
    for (int64_t i = 0; i < range.count; ++i) grads[i] = staged[i] * scale;
  } else if (scale != 1.0f) {
    for (int64_t i = 0; i < range.count; ++i) grads[i] *= scale;
  }
}

void GradSync::finish(float scale) {
  const double finish_start_ms = now_ms();
  FT_CHECK(in_backward_, "GradSync::finish without begin_backward");
  in_backward_ = false;
  if (!communicating_) {
    stats_ = CommStepStats();
    return;
  }
  communicating_ = false;
  // Launch order is still bucket order: everything before next_launch_ is already out.
  const int count = static_cast<int>(buckets_.size());
  while (next_launch_ < count) launch(next_launch_++);

  CommStepStats stats;
  const bool reduced = reduces();
  for (int b = 0; b < count; ++b) {
    if (tickets_[b] != 0) comm_thread_->wait(tickets_[b]);
    if (handles_[b]) handles_[b]->wait();  // NCCL: the compute stream waits; the host does not
    handles_[b].reset();
    scale_bucket(b, scale);
    const int64_t bytes = wire_bytes(b);
    stats.bucket_bytes.push_back(bytes);
    stats.comm_ms += bucket_comm_ms_[b];
    // Only what ran after backward returned is exposed; an inline bucket (no overlap) started
    // inside finish(), so all of it is, exactly (no subtraction, no rounding).
    if (bucket_start_ms_[b] >= finish_start_ms)
      stats.exposed_ms += bucket_comm_ms_[b];
    else
      stats.exposed_ms += std::max(0.0, bucket_start_ms_[b] + bucket_comm_ms_[b] - finish_start_ms);
    if (record_timings_) {
      BucketTiming timing = timings_[b];
      timing.bucket = b;
      timing.bytes = bytes;
      stats.bucket_timings.push_back(timing);
    }
    if (reduced) {
      ++stats.allreduce_calls;
      stats.bytes_reduced += bytes;
    }
  }
  stats.extra_memory_bytes = static_cast<int64_t>(staging_.bytes()) +
                             (wire_ != nullptr ? params_.num_trainable_floats() * 2 : 0);
  stats.emulated = reduced && options_.emulate.enabled();
  stats_ = std::move(stats);

  if (options_.reorder_buckets && !reordered_) rebuild_in_observed_order();
}

void GradSync::rebuild_in_observed_order() {
  reordered_ = true;
  std::vector<ParamId> order = complete_order(params_, observed_order_);
  // Ranks may observe different orders (threads, timing); rank 0's is the one everyone uses.
  std::vector<float> order_floats(order.begin(), order.end());
  host_comm_.broadcast(order_floats.data(), order_floats.size(), 0);
  order.assign(order_floats.begin(), order_floats.end());
  build_buckets(order);
  check_same_layout_on_all_ranks();
}

}  // namespace ft
