// DeviceStepControl: the scalars of one training step, in device memory, for a step that a CUDA
// graph replays (fusion.cuda_graph). A replay reuses every captured kernel argument, so what
// changes from step to step must be read from memory instead: the host writes the optimizer's
// constants for the coming step before each replay; the step's own kernels write the loss, the
// gradient norm, the clip scale and whether the step diverged; the host reads them back after the
// replay (the step's one synchronisation). With a control set (ParamSweep::set_device_control),
// the cuda optimizer kernels skip a diverged step and multiply every gradient by the clip scale as
// they read it, which gives the bits of clipping in place first (x * 1.0f is x).
// finish_step_control is the formula both the CPU clip and the CUDA kernel use.
// Thread safety: plain data and pure functions.
#pragma once
#include <cmath>

#include "core/device.h"
#include "core/hd.h"
#include "kernels/optimizer_math.h"

namespace ft {

struct DeviceStepControl {
  // Written by the host before each replay.
  AdamWStep adamw;
  SgdStep sgd;
  float max_norm = 0;  // optim.grad_clip; <= 0: no clipping
  // Written by the step's kernels.
  double square_sum = 0;  // of every trainable gradient, after the allreduce and averaging
  float loss = 0;         // this rank's loss
  float grad_norm = 0;
  float clip_scale = 1;  // every gradient is multiplied by it before the update
  float diverged = 0;    // 1 when this rank's loss or norm is not finite; then summed over ranks
};

// The factor global-norm clipping scales gradients by: max_norm / (norm + 1e-6) when the norm
// exceeds max_norm > 0, else 1 (a NaN norm compares false: not scaled, and the step is skipped).
FT_HD float clip_grad_scale(float norm, float max_norm) {
  return max_norm > 0.0f && norm > max_norm ? max_norm / (norm + 1e-6f) : 1.0f;
}

// From control.square_sum and control.loss: the norm, the clip scale and this rank's divergence.
FT_HD void finish_step_control(DeviceStepControl& control) {
  using std::isfinite;
  using std::sqrt;
  const float norm = static_cast<float>(sqrt(control.square_sum));
  control.grad_norm = norm;
  control.clip_scale = clip_grad_scale(norm, control.max_norm);
  control.diverged = isfinite(control.loss) && isfinite(norm) ? 0.0f : 1.0f;
}

// The step is skipped when any rank diverged (diverged holds the sum over ranks by then).
FT_HD bool step_skipped(const DeviceStepControl& control) {
  return control.diverged > 0.0f;
}

FT_HD void constants_of(const DeviceStepControl& control, AdamWStep* step) {
  *step = control.adamw;
}
FT_HD void constants_of(const DeviceStepControl& control, SgdStep* step) {
  *step = control.sgd;
}

// What an optimizer kernel applies. Without a control: its own `step`, gradients unscaled. With
// one: the control's constants and clip scale, or nothing at all when the step was skipped
// (returns false: the kernel must leave every parameter and state as it is).
template <typename Step>
FT_HD bool apply_step_control(const DeviceStepControl* control, Step* step, float* grad_scale) {
  *grad_scale = 1.0f;
  if (control == nullptr) return true;
  if (step_skipped(*control)) return false;
  constants_of(*control, step);
  *grad_scale = control->clip_scale;
  return true;
}

// finish_step_control on the device: copies *loss into control->loss first. One thread; enqueued
// on `stream` (optimizer.cu; CUDA builds only).
void finish_step_control_cuda(DeviceStepControl* control, const float* loss, CudaStream stream);

}  // namespace ft
