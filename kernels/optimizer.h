// The optimizers' kernels, CPU (optimizer.cpp) beside CUDA (optimizer.cu), shared by the
// per-tensor sweep (model/optimizer.h, the twin) and fusion/'s chunked multi-tensor sweep
// (fusion/multi_tensor.h): AdamW and SGD updates over a range of floats, the gradient norm's
// squares in a fixed summation order, and their device forms. The per-element math is
// optimizer_math.h's.
// Thread safety: pure functions over the pointers given.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/math/bf16_math.h"
#include "kernels/optimizer_math.h"

namespace ft {

// AdamWStep, SgdStep and the per-element math (adamw_element, sgd_element) live in
// optimizer_math.h, shared with the CUDA kernels.
// Updates `count` consecutive floats of value, exp_avg and exp_avg_sq from grad.
void adamw_update(float* value, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t count,
                  const AdamWStep& step, bool weight_decay);

void sgd_update(float* value, float* momentum_buffer, const float* grad, int64_t count,
                const SgdStep& step, bool weight_decay);

// The same, also writing each updated value rounded to bf16 into `bf16_value` in the same loop:
// the multi-tensor sweep's weight copies (train.precision: bf16), whose twin is the update
// followed by a separate cast_to_bf16 sweep (the same bits).
void adamw_update(float* value, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t count,
                  const AdamWStep& step, bool weight_decay, bf16_bits* bf16_value);
void sgd_update(float* value, float* momentum_buffer, const float* grad, int64_t count,
                const SgdStep& step, bool weight_decay, bf16_bits* bf16_value);

// The same, consuming the gradient (the multi-tensor sweep's folded clip and zeroing): each
// element leaves grad[i] = 0 after its update, the next step's zeroing done while the line is in
// cache. AdamW updates from g = grad[i] * grad_scale, the fp32 product a scale pass would have
// stored (grad_scale 1 leaves g exact): its moments multiply g again, so the product is rounded
// before any sum. SGD takes no scale: in g + decay * value the compiler may contract grad * scale
// into an fma the scale pass never rounds that way. `bf16_value` may be null (no weight copies).
void adamw_update_consuming(float* value, float* exp_avg, float* exp_avg_sq, float* grad,
                            int64_t count, const AdamWStep& step, bool weight_decay,
                            bf16_bits* bf16_value, float grad_scale);
void sgd_update_consuming(float* value, float* momentum_buffer, float* grad, int64_t count,
                          const SgdStep& step, bool weight_decay, bf16_bits* bf16_value);

// The gradient norm's summation order, the same for both sweeps so their norms agree bitwise:
// the flat gradient buffer is cut into chunks of kSweepChunk floats; in a chunk, lane L (flat
// index % kNormLanes) sums the squares of its floats in double in index order; a chunk adds its
// lanes in lane order, and the total adds the chunks in chunk order. Lanes let the chunked pass
// vectorise while a tensor boundary inside a chunk changes nothing.
constexpr int64_t kSweepChunk = 65536;  // floats per chunk of a multi-tensor pass
constexpr int kNormLanes = 8;
using NormLanes = std::array<double, kNormLanes>;
// Adds the squares of grad[0, count), which start at flat index `flat_index`, into `lanes`.
void accumulate_squares(NormLanes& lanes, const float* grad, int64_t flat_index, int64_t count);
double sum_chunk_lanes(const std::vector<NormLanes>& chunk_lanes);

struct DeviceStepControl;  // step_control.h

// The same on device pointers, one launch per call, enqueued on `stream` (optimizer.cu; CUDA
// builds only). They are the per-tensor sweep's kernels on cuda. A non-null `control` (device
// memory) overrides `step` and supplies the clip scale and the skip decision (step_control.h).
void adamw_update_cuda(float* value, float* exp_avg, float* exp_avg_sq, const float* grad,
                       int64_t count, const AdamWStep& step, bool weight_decay,
                       const DeviceStepControl* control, CudaStream stream);
void sgd_update_cuda(float* value, float* momentum_buffer, const float* grad, int64_t count,
                     const SgdStep& step, bool weight_decay, const DeviceStepControl* control,
                     CudaStream stream);
void scale_cuda(float* data, int64_t count, float scale, CudaStream stream);
// The norm on cuda sums in double too, but in its own deterministic order (not the CPU lane order
// above, so cuda and cpu norms agree to rounding, not bitwise): each (tensor, chunk of
// kSweepChunk floats of that tensor) gives one partial sum, written to partials[c] for the
// tensor's c-th chunk; square_sum_total_cuda then adds `count` partials in a fixed tree and
// copies the total to the host, the only host synchronisation of a sweep.
// REQUIRES: partials holds ceil(count / kSweepChunk) doubles (device memory).
void square_sum_partials_cuda(double* partials, const float* data, int64_t count,
                              CudaStream stream);
// REQUIRES: total is one device double, distinct from partials[0, count).
double square_sum_total_cuda(double* total, const double* partials, int64_t count,
                             CudaStream stream);
// The same without the copy to the host: *total is written on the device (0 when count is 0).
void square_sum_total_on_device_cuda(double* total, const double* partials, int64_t count,
                                     CudaStream stream);

}  // namespace ft
