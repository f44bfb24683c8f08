// fusion.horizontal.multi_tensor: MultiTensorSweep, a ParamSweep (model/optimizer.h) that runs
// the optimizer step, gradient zeroing and the global gradient norm as one chunked pass each over
// ParamStore's flat buffers (Apex's multi_tensor_apply, chunks of kSweepChunk = 65,536 floats)
// instead of a loop that visits one tensor at a time. Chunks run in parallel; inside a chunk, a
// precomputed segment table gives the flat ranges that share a weight-decay flag, so a chunk is a
// handful of vectorised range updates. app/training/trainer.cpp picks it; the per-tensor sweep of
// model/optimizer.cpp is the twin: both call the same range kernels (adamw_update, sgd_update,
// accumulate_squares), so the two agree bit for bit; tests/fusion_multi_tensor_test.cpp checks it.
// On cuda (params.device()) the sweep runs the Apex-style kernels of fusion/multi_tensor.cu over
// per-parameter tensor lists packed into kernel-argument tables (fusion/multi_tensor_launch.h):
// a few launches per pass instead of one per tensor; square_sum is the only pass that waits for
// the GPU (it copies one double to the host). With bf16 weight copies (train.precision: bf16) the
// AdamW and SGD passes write them on both devices as they update the masters. The cuda norm's
// order is not the CPU lane order, so cuda and cpu agree to rounding; the cuda per-tensor and
// multi-tensor norms agree bitwise.
// Thread safety: the free functions are pure functions of the buffers given; a sweep is not
// synchronised, and the training thread owns it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/math/bf16_math.h"
#include "fusion/multi_tensor_launch.h"
#include "model/optimizer.h"
#include "model/params.h"

namespace ft {

// Flat floats [begin, end) whose parameters share one weight-decay flag.
struct MultiTensorSegment {
  int64_t begin = 0, end = 0;
  bool weight_decay = false;
};

// Chunk c covers flat floats [c * kSweepChunk, min(numel, (c + 1) * kSweepChunk)) and the
// segments [chunk_segments[c], chunk_segments[c + 1]), cut at the chunk's edges.
struct MultiTensorPlan {
  int64_t numel = 0;
  std::vector<MultiTensorSegment> segments;
  std::vector<int> chunk_segments;  // [num_chunks + 1]
  int64_t num_chunks() const { return static_cast<int64_t>(chunk_segments.size()) - 1; }
};

// REQUIRES: params allocated. Adjacent parameters with equal flags merge into one segment.
MultiTensorPlan make_multi_tensor_plan(const ParamStore& params);

// Each array is laid out like ParamStore::flat_values() and holds plan.numel floats. A non-null
// `bf16_values` (train.precision: bf16) receives the updated values rounded to bf16 segment by
// segment, the horizontal fusion of the weight-copy sweep into the update; its unfused twin is
// ParamStore::refresh_bf16_copies after a per-tensor step, and the two agree bit for bit.
void multi_tensor_adamw(const MultiTensorPlan& plan, float* values, float* exp_avg,
                        float* exp_avg_sq, const float* grads, const AdamWStep& step,
                        bf16_bits* bf16_values = nullptr);
void multi_tensor_sgd(const MultiTensorPlan& plan, float* values, float* momentum_buffer,
                      const float* grads, const SgdStep& step, bf16_bits* bf16_values = nullptr);

// The same passes consuming the gradients (adamw_update_consuming): each leaves the gradient
// zero, folding the next step's zeroing pass into the update, and AdamW reads grad * grad_scale,
// folding the clip's scale pass too (SGD's caller scales first). Their twin is scale (when
// grad_scale != 1), the pass above, then zero: the same bits (tests/fusion_multi_tensor_test.cpp).
// REQUIRES: the plan's segments cover [0, numel).
void multi_tensor_adamw_consuming(const MultiTensorPlan& plan, float* values, float* exp_avg,
                                  float* exp_avg_sq, float* grads, const AdamWStep& step,
                                  bf16_bits* bf16_values, float grad_scale);
void multi_tensor_sgd_consuming(const MultiTensorPlan& plan, float* values, float* momentum_buffer,
                                float* grads, const SgdStep& step, bf16_bits* bf16_values);

// The bf16 weight copies a CUDA AdamW or SGD pass writes as it updates the masters: for every
// element it updates at values_base + i it stores copies[i] = bf16(updated value), the CPU
// passes' fusion of the weight-copy sweep. Both null: no copies.
struct Bf16CopyTarget {
  const float* values_base = nullptr;  // ParamStore::flat_values() on the device
  bf16_bits* copies = nullptr;         // ParamStore::flat_bf16_values(), same layout
};
// multi_tensor_adamw_cuda / multi_tensor_sgd_cuda (fusion/multi_tensor_launch.h) that also write
// `copies` (multi_tensor.cu; CUDA builds only). The tables' value arrays must lie in
// [values_base, values_base + numel of the copies).
void multi_tensor_adamw_cuda(const std::vector<MultiTensorLaunch<4>>& launches,
                             const AdamWStep& step, const DeviceStepControl* control,
                             const Bf16CopyTarget& copies, CudaStream stream);
void multi_tensor_sgd_cuda(const std::vector<MultiTensorLaunch<3>>& launches, const SgdStep& step,
                           const DeviceStepControl* control, const Bf16CopyTarget& copies,
                           CudaStream stream);

// Over `numel` flat floats, chunked.
void multi_tensor_zero(float* data, int64_t numel);
void multi_tensor_scale(float* data, int64_t numel, float scale);
// Sum of squares in the order model/optimizer.h documents (the per-tensor norm's order).
double multi_tensor_square_sum(const float* data, int64_t numel);

// The free functions above behind ParamSweep, with the plan of the store it was made for.
class MultiTensorSweep : public ParamSweep {
 public:
  // REQUIRES: params allocated; every later call passes this store (checked by size).
  explicit MultiTensorSweep(const ParamStore& params);

  void adamw(ParamStore& params, Tensor& exp_avg, Tensor& exp_avg_sq,
             const AdamWStep& step) override;
  void sgd(ParamStore& params, Tensor& momentum_buffer, const SgdStep& step) override;
  double square_sum(ParamStore& params) override;
  void scale(ParamStore& params, float scale) override;
  void zero(ParamStore& params) override;
  void square_sum_on_device(ParamStore& params, double* device_total) override;
  // adamw and sgd write the store's bf16 copies as they update the masters, on either device.
  bool writes_bf16_copies() const override { return true; }
  // On the CPU: the next adamw or sgd runs the *_consuming passes.
  bool fold_into_next_update(const ParamStore& params, float grad_scale) override;

  const MultiTensorPlan& plan() const { return plan_; }

 private:
  static bf16_bits* bf16_copies(ParamStore& params);
  static Bf16CopyTarget bf16_copy_target(ParamStore& params);
  // Tables packed for a pass over arrays laid out like flat_values() that start at `bases`,
  // repacked when the bases change (the trainer's buffers do not move, so normally once).
  template <int Depth>
  struct PackedPass {
    std::array<float*, Depth> bases{};
    std::vector<MultiTensorLaunch<Depth>> launches;
  };

  void check_store(const ParamStore& params) const;
  // cuda: enqueues the norm's partials into norm_scratch_ (grown as needed); returns their count.
  int64_t square_sum_partials(ParamStore& params);
  template <int Depth>
  const std::vector<MultiTensorLaunch<Depth>>& packed(PackedPass<Depth>& pass,
                                                      const ParamStore& params,
                                                      const std::array<float*, Depth>& bases);

  MultiTensorPlan plan_;
  PackedPass<4> adamw_pass_;
  PackedPass<3> sgd_pass_;
  PackedPass<1> grad_pass_;
  Tensor norm_scratch_;              // on cuda: the norm's partials and total, as doubles
  bool segments_cover_all_ = false;  // the plan's segments are [0, numel): consuming may run
  bool fold_pending_ = false;        // fold_into_next_update asked; the next update consumes
  float fold_scale_ = 1.0f;
};

std::unique_ptr<ParamSweep> make_multi_tensor_sweep(const ParamStore& params);

}  // namespace ft
