#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/allocator.h"
#include "core/capture_guard.h"
#include "core/check.h"

#if defined(FT_HAVE_CUDA)
#include "core/cuda/bf16_kernels.h"
#include "core/cuda/cuda_context.h"
#include "core/cuda/device_memory.h"
#endif

namespace ft {
namespace {

CachingAllocator& allocator_for(Device device) {
#if defined(FT_HAVE_CUDA)
  if (device == Device::kCuda) return CachingAllocator::device();
#else
  FT_CHECK(device == Device::kCpu, "a cuda tensor in a build without the CUDA path");
#endif
  return CachingAllocator::host();
}

}  // namespace

const char* dtype_name(DType dtype) {
  return dtype == DType::kBF16 ? "bf16" : "fp32";
}

void Tensor::throw_dtype_mismatch(DType asked) const {
  FT_FAIL("a ", dtype_name(dtype_), " tensor ", shape_str(shape_), " read as ", dtype_name(asked));
}

int64_t shape_numel(const Shape& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) {
    FT_CHECK(extent >= 0, "negative extent in shape ", shape_str(shape));
    count *= extent;
  }
  return count;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

Tensor Tensor::allocate(const Shape& shape, Device device, DType dtype,
                        CachingAllocator& allocator) {
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = shape;
  tensor.numel_ = shape_numel(shape);
  tensor.device_ = device;
  const size_t bytes = tensor.bytes();
  CachingAllocator* source = &allocator;
  void* block = source->allocate(bytes);
  tensor.storage_ =
      std::shared_ptr<void>(block, [source, bytes](void* ptr) { source->release(ptr, bytes); });
  tensor.base_ = block;
  return tensor;
}

Tensor Tensor::empty(const Shape& shape, Device device, DType dtype) {
  return allocate(shape, device, dtype, allocator_for(device));
}

Tensor Tensor::empty_pinned(const Shape& shape) {
#if defined(FT_HAVE_CUDA)
  return allocate(shape, Device::kCpu, DType::kF32, CachingAllocator::pinned());
#else
  return empty(shape, Device::kCpu);
#endif
}

Tensor Tensor::zeros(const Shape& shape, Device device, DType dtype) {
  Tensor tensor = empty(shape, device, dtype);
  tensor.fill(0.0f);
  return tensor;
}

Tensor Tensor::wrap(float* data, const Shape& shape, Device device) {
  Tensor tensor;
  tensor.base_ = data;
  tensor.shape_ = shape;
  tensor.numel_ = shape_numel(shape);
  tensor.device_ = device;
  return tensor;
}

Tensor Tensor::wrap(bf16_bits* data, const Shape& shape, Device device) {
  Tensor tensor;
  tensor.base_ = data;
  tensor.dtype_ = DType::kBF16;
  tensor.shape_ = shape;
  tensor.numel_ = shape_numel(shape);
  tensor.device_ = device;
  return tensor;
}

int64_t Tensor::size(int axis) const {
  if (axis < 0) axis += dim();
  FT_CHECK(axis >= 0 && axis < dim(), "axis ", axis, " out of range for shape ", shape_str(shape_));
  return shape_[axis];
}

Tensor Tensor::view(const Shape& shape) const {
  FT_CHECK(shape_numel(shape) == numel_, "cannot view ", shape_str(shape_), " as ",
           shape_str(shape));
  Tensor result = *this;
  result.shape_ = shape;
  return result;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  FT_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows [", begin, ", ", end,
           ") out of range for shape ", shape_str(shape_));
  const int64_t row_numel = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Tensor result = *this;
  result.offset_ += begin * row_numel;
  result.shape_[0] = end - begin;
  result.numel_ = (end - begin) * row_numel;
  return result;
}

void Tensor::fill(float value) {
  if (dtype_ == DType::kBF16) {
#if defined(FT_HAVE_CUDA)
    if (device_ == Device::kCuda)
      return cuda_fill_bf16(bf16_data(), numel_, float_to_bf16(value),
                            cuda_context().compute_stream());
#endif
    std::fill(bf16_data(), bf16_data() + numel_, float_to_bf16(value));
    return;
  }
#if defined(FT_HAVE_CUDA)
  if (device_ == Device::kCuda)
    return cuda_fill(data(), numel_, value, cuda_context().compute_stream());
#endif
  std::fill(data(), data() + numel_, value);
}

void Tensor::copy_from(const Tensor& source) {
  FT_CHECK(source.numel() == numel_, "copy_from: ", shape_str(source.shape()), " into ",
           shape_str(shape_));
  FT_CHECK(source.dtype() == dtype_, "copy_from: a ", dtype_name(source.dtype()), " tensor into a ",
           dtype_name(dtype_), " one");
  if (numel_ == 0) return;
  void* destination = typed_data(dtype_);
  const void* origin = source.typed_data(dtype_);
#if defined(FT_HAVE_CUDA)
  if (device_ == Device::kCuda || source.device() == Device::kCuda)
    return cuda_copy(destination, origin, bytes(), cuda_context().compute_stream());
#endif
  std::memcpy(destination, origin, bytes());
}

Tensor Tensor::to(Device device) const {
  Tensor result = Tensor::empty(shape_, device, dtype_);
  result.copy_from(*this);
  return result;
}

std::vector<float> Tensor::to_host_vector() const {
  // On every device: the CPU tests run the captured step's sequence under the guard.
  require_not_capturing("Tensor::to_host_vector (reading a tensor on the host)");
  std::vector<float> host(static_cast<size_t>(numel_));
  if (dtype_ == DType::kBF16) {
    const Tensor on_host = device_ == Device::kCpu ? *this : to(Device::kCpu);
    const bf16_bits* bits = on_host.bf16_data();
    for (int64_t i = 0; i < numel_; ++i) host[i] = bf16_to_float(bits[i]);
    return host;
  }
  if (numel_ > 0) Tensor::wrap(host.data(), shape_).copy_from(*this);
  return host;
}

}  // namespace ft
