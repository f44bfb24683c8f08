// GradSync: the data-parallel reducer (DDP-style). It groups gradients into buckets over
// ParamStore::flat_grads, and launches each bucket's allreduce as soon as its last gradient is
// announced final by the executor, so communication overlaps the rest of backward. finish() leaves
// flat_grads = scale * (sum over ranks of the local gradients).
//
// Launch order: buckets launch in one fixed order shared by every rank (the bucket list, checked
// identical across ranks at construction), and bucket i launches only once it is complete AND
// buckets 0..i-1 have launched, so ranks always issue the same collective sequence: no deadlock.
//
// No gradient is read or written while its bucket is in flight, because: a param is announced only
// once its gradient is final for this backward (the executor writes it no more); nothing else
// writes gradients until the optimizer, which runs after finish() has waited for every bucket;
// grad-accumulation micro-batches (communicate = false) launch nothing, so their += never races.
// Scaling happens in finish(), on the training thread, right after each bucket completes.
//
// bucket_view = false copies each bucket into a fusion buffer laid out like flat_grads (so it costs
// one gradient-sized buffer, reported in extra_memory_bytes), reduces there, and copies back with
// the scale folded into the copy. bucket_view = true reduces flat_grads in place (no extra memory).
//
// Overlap runs the collectives on a CommThread (see comm/comm_thread.h for the MPI threading
// contract). REQUIRES: nobody else uses `comm` between begin_backward(true) and finish().
//
// Gradients on cuda: with a device backend (NCCL) a bucket is launched on the training thread
// when complete: its allreduce goes on the communication stream after an event recorded on the
// compute stream, and finish() makes the compute stream wait for each bucket's done event and
// scales on the compute stream, so the optimizer's kernels follow without a device-wide
// synchronise and the host never blocks. With a host backend (MPI, e.g. several ranks sharing one
// GPU, which NCCL refuses) each bucket is copied to pinned host memory, reduced there (on the comm
// thread when overlapping) and copied back, then scaled on the device.
// grad_dtype = kBf16 (comm.grad_dtype: bf16) sends every bucket as bf16: its fp32 gradients are
// rounded into a bf16 staging buffer laid out like flat_grads (half a gradient buffer, allocated
// once, on the device only for a device backend), the allreduce runs there on half the bytes, and
// finish() widens the sum back into flat_grads with the scale applied in fp32. The cast-in counts
// as communication (like a copy-in), the cast-back as compute (like the fusion buffer's copy-out).
// The bf16 buffer replaces the fusion buffer, so bucket_view changes nothing then.
// Thread safety: every public method is called by the training thread.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/buckets.h"
#include "comm/comm_dtype.h"
#include "comm/comm_thread.h"
#include "comm/communicator.h"
#include "comm/emulated_link.h"
#include "model/params.h"

namespace ft {

struct GradSyncOptions {
  bool bucketing = true;         // false: one allreduce per parameter tensor (unfused baseline)
  double bucket_mb = 4;          // MiB cap of every bucket but the first
  double first_bucket_mb = 1;    // MiB cap of the first bucket, so communication starts early
  bool bucket_view = true;       // true: reduce flat_grads in place; false: through a fusion buffer
  bool overlap = true;           // true: launch each bucket during backward, on a comm thread
  bool reorder_buckets = false;  // after the first step, rebuild buckets in rank 0's observed order
  // true: sums in rank order (Summation::kRankOrder), so bucketing never changes a bit of the
  // result; false: the MPI library's own allreduce, faster and topology-aware, whose rounding
  // depends on bucket sizes from three ranks up. Both the inline and the overlapped path follow it.
  bool deterministic = false;
  // true: run every bucket's allreduce even on one rank, where it changes nothing, so a
  // one-GPU machine exercises the real backend path (NCCL launch, events, staging copies).
  // gpu_check.sh and the tests set it; training gains nothing from it.
  bool single_rank_allreduce = false;
  // The element type buckets travel in: kBf16 halves the bytes (and adds a bf16 rounding of each
  // rank's gradient plus one per addition). Backends without bf16 allreduce throw at the first one.
  CommDtype grad_dtype = CommDtype::kFloat32;
  EmulatedLink emulate;  // added on top of every real allreduce, charged the bytes sent
};

// One bucket's allreduce in one step, on the clock of core/timer.h now_ms(). With overlap the
// training thread launches (queues) a bucket and the comm thread starts it once the buckets before
// it are done; without overlap all three times fall inside finish().
struct BucketTiming {
  int bucket = 0;        // index in launch order
  int64_t bytes = 0;     // as sent: 2 per gradient with grad_dtype kBf16
  double launch_ms = 0;  // handed to the comm thread, or run inline
  double start_ms = 0;   // the allreduce began (copy-in for bucket_view = false included)
  double done_ms = 0;    // the allreduce and any emulated link delay finished
};

struct CommStepStats {
  // Sum over buckets of each one's communication: copy-in (bucket_view = false or host
  // staging), allreduce, emulated link delay and host-staged copy-back. 0 on NCCL, whose
  // allreduces run on their own stream, off the host's clock.
  double comm_ms = 0;
  // The part of comm_ms that ran after backward returned (from finish() entry), when nothing was
  // left to hide it: all of it without overlap, so exposed_ms <= comm_ms by construction. Scaling
  // and the fusion buffer's copy-out are compute (the trainer's compute_ms), not communication.
  double exposed_ms = 0;
  int64_t allreduce_calls = 0;
  int64_t bytes_reduced = 0;          // payload bytes over all allreduces, in grad_dtype
  std::vector<int64_t> bucket_bytes;  // payload of each bucket, in launch order
  int64_t extra_memory_bytes = 0;     // staging buffers (bucket_view = false, bf16), else 0
  bool emulated = false;              // numbers include an emulated link: say so in any output
  std::vector<BucketTiming> bucket_timings;  // per bucket, only while set_record_timings(true)
};

class GradSync {
 public:
  // REQUIRES: comm and params outlive this; params allocated. ready_order =
  // executor.grad_ready_order(). Collective: every rank constructs it (layouts are compared).
  // `host_comm` carries the small host-memory messages (the bucket-layout check, the observed
  // order); null = `comm`, which must then reduce host memory. With NCCL pass the MPI
  // communicator of the same ranks.
  GradSync(Communicator& comm, ParamStore& params, std::vector<ParamId> ready_order,
           GradSyncOptions options, Communicator* host_comm = nullptr);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Before each micro-batch's backward. communicate = false for all but the last micro-batch of
  // gradient accumulation: such a backward launches nothing, and finish() after it is a no-op.
  void begin_backward(bool communicate);
  // Executor callback: `id`'s gradient is final for this backward.
  void on_grad_ready(ParamId id);
  // After backward returns: launches what remains (params never announced count as final now),
  // waits for every bucket and scales. Collective when communicating.
  void finish(float scale);

  // On: finish() also reports when each bucket was launched, started and done (the timeline
  // trace). Off by default; it adds two clock reads per bucket and changes nothing else.
  // REQUIRES: not inside begin_backward() ... finish().
  void set_record_timings(bool on);

  const CommStepStats& last_stats() const { return stats_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  void build_buckets(const std::vector<ParamId>& order);
  void check_same_layout_on_all_ranks();
  void launch_ready_buckets();
  void launch(int bucket);
  void launch_on_device(int bucket);  // device backend: an async allreduce on the comm stream
  void run_bucket(int bucket);        // reduce_bucket, timed when recording
  void reduce_bucket(int bucket);     // the communication part: copy-in, allreduce, link delay
  void scale_bucket(int bucket, float scale);
  void rebuild_in_observed_order();
  // Whether buckets go through the backend at all: more than one rank, or the one-rank check.
  bool reduces() const { return comm_.size() > 1 || options_.single_rank_allreduce; }
  bool bf16() const { return options_.grad_dtype == CommDtype::kBf16; }
  // What bucket `bucket` puts on the wire.
  int64_t wire_bytes(int bucket) const {
    return buckets_[bucket].count * comm_dtype_bytes(options_.grad_dtype);
  }
  void allocate_wire();

  Communicator& comm_;       // the gradient allreduces
  Communicator& host_comm_;  // host-memory control messages
  ParamStore& params_;
  GradSyncOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;     // by ParamId; -1 for buffers
  std::vector<int> pending_params_;      // by bucket: params not yet announced in this backward
  std::vector<bool> announced_;          // by ParamId, this backward
  std::vector<int64_t> tickets_;         // by bucket: CommThread ticket, 0 = not launched
  std::vector<double> bucket_comm_ms_;   // by bucket, written by whoever ran the allreduce
  std::vector<double> bucket_start_ms_;  // by bucket: when its communication began (same writer)
  bool record_timings_ = false;
  std::vector<BucketTiming> timings_;  // by bucket: launch by the training thread, rest by runner
  int next_launch_ = 0;
  bool in_backward_ = false;
  bool communicating_ = false;
  bool reordered_ = false;
  std::vector<ParamId> observed_order_;  // ready order of the first communicating backward
  bool device_grads_ = false;            // flat_grads on cuda
  bool device_comm_ = false;             // the backend reduces device memory (NCCL)
  // Laid out like flat_grads: the fusion buffer of bucket_view = false (on the gradients'
  // device), or pinned host memory for cuda gradients over a host backend.
  Tensor staging_;
  // grad_dtype kBf16: the bf16 image of flat_grads that is reduced. Points into wire_host_, or
  // into device memory that wire_device_ owns (device gradients over a device backend).
  bf16_bits* wire_ = nullptr;
  std::vector<bf16_bits> wire_host_;
  std::shared_ptr<void> wire_device_;
  std::vector<std::unique_ptr<CommHandle>> handles_;  // by bucket: device backend in flight
  CommStepStats stats_;
  // Last, so it is destroyed first: no job outlives the buckets or fusion buffer it touches.
  std::unique_ptr<CommThread> comm_thread_;  // overlap with more than one rank only
};

}  // namespace ft
