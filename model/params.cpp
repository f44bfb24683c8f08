#include "model/params.h"

#include <cstring>

#include "core/bf16_cast.h"
#include "core/check.h"
#include "core/device.h"
#include "core/rng.h"
#include "model/ops/cast.h"

#if defined(FT_HAVE_CUDA)
#include "core/cuda/cuda_context.h"
#endif

namespace ft {

ParamId ParamStore::add_entry(Param param) {
  FT_CHECK(!allocated_, "parameter '", param.name, "' registered after allocate()");
  FT_CHECK(index_.count(param.name) == 0, "parameter '", param.name, "' registered twice");
  const ParamId id = static_cast<ParamId>(params_.size());
  index_.emplace(param.name, id);
  params_.push_back(std::move(param));
  return id;
}

ParamId ParamStore::add(const std::string& name, const Shape& shape, ParamInit init, float init_std,
                        bool weight_decay) {
  Param param;
  param.name = name;
  param.shape = shape;
  param.init = init;
  param.init_std = init_std;
  param.weight_decay = weight_decay;
  return add_entry(std::move(param));
}

ParamId ParamStore::add_buffer(const std::string& name, const Shape& shape, ParamInit init) {
  Param param;
  param.name = name;
  param.shape = shape;
  param.init = init;
  param.weight_decay = false;
  param.trainable = false;
  return add_entry(std::move(param));
}

void ParamStore::enable_bf16_copies() {
  FT_CHECK(!allocated_, "enable_bf16_copies() after allocate()");
  bf16_copies_ = true;
}

void ParamStore::refresh_bf16_copies() {
  FT_CHECK(bf16_copies_ && allocated_, "refresh_bf16_copies() without allocated bf16 copies");
  bf16_stale_ = false;
  const int64_t count = flat_values_.numel();
  if (count == 0) return;
#if defined(FT_HAVE_CUDA)
  // The cast op's kernel over the flat buffer as one row, on the compute stream every forward
  // kernel uses, so the GEMMs that read the copies are ordered after it (and a captured step
  // holds it).
  if (device_ == Device::kCuda)
    return cast_forward_cuda(flat_bf16_values_.bf16_data(), flat_values_.data(), 1, count, 0, 0,
                             cuda_context().compute_stream());
#endif
  cast_to_bf16(flat_bf16_values_.bf16_data(), flat_values_.data(), count);
}

void ParamStore::allocate(Device device) {
  FT_CHECK(!allocated_, "allocate() called twice");
  device_ = device;
  int64_t trainable_floats = 0, buffer_floats = 0;
  for (Param& param : params_) {
    int64_t& cursor = param.trainable ? trainable_floats : buffer_floats;
    param.offset = cursor;
    cursor += shape_numel(param.shape);
  }
  flat_values_ = Tensor::zeros({trainable_floats}, device);
  flat_grads_ = Tensor::zeros({trainable_floats}, device);
  flat_buffers_ = Tensor::zeros({buffer_floats}, device);
  if (bf16_copies_) flat_bf16_values_ = Tensor::zeros({trainable_floats}, device, DType::kBF16);
  for (Param& param : params_) {
    if (param.trainable) {
      param.value = Tensor::wrap(flat_values_.data() + param.offset, param.shape, device);
      param.grad = Tensor::wrap(flat_grads_.data() + param.offset, param.shape, device);
      if (bf16_copies_)
        param.bf16_value =
            Tensor::wrap(flat_bf16_values_.bf16_data() + param.offset, param.shape, device);
    } else {
      param.value = Tensor::wrap(flat_buffers_.data() + param.offset, param.shape, device);
    }
  }
  allocated_ = true;
}

void ParamStore::initialize(uint64_t seed) {
  FT_CHECK(allocated_, "initialize() before allocate()");
  mark_changed();
  Rng rng(seed);
  for (Param& param : params_) {
    const int64_t count = param.value.numel();
    switch (param.init) {
      case ParamInit::kNormal: {
        // Drawn on the host on every device, so cpu and cuda runs start from the same values.
        Tensor host = device_ == Device::kCpu ? param.value : Tensor::empty(param.shape);
        float* values = host.data();
        for (int64_t i = 0; i < count; ++i) values[i] = param.init_std * rng.normal();
        if (device_ != Device::kCpu) param.value.copy_from(host);
        break;
      }
      case ParamInit::kOnes:
        param.value.fill(1.0f);
        break;
      case ParamInit::kZeros:
        param.value.fill(0.0f);
        break;
    }
  }
}

// One fill per tensor: the per-tensor twin of fusion/multi_tensor.h's chunked zeroing.
void ParamStore::zero_grads() {
  for (Param& param : params_)
    if (param.trainable) param.grad.fill(0.0f);
}

ParamId ParamStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

}  // namespace ft
