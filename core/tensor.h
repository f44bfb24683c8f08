// Tensor: an n-d array of float32 (the default) or bfloat16 on a device, row-major and contiguous.
// Views (reshape, row slices, wrapped external buffers) share storage, which is how parameters
// live inside one flat buffer. bf16 elements are bit patterns (core/math/bf16_math.h): data()
// serves float32 tensors only and bf16_data() bf16 ones, so a kernel cannot read one as the other.
// Thread safety: a Tensor is a value; concurrent reads are fine, writes need outside ordering.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/math/bf16_math.h"

namespace ft {

class CachingAllocator;

enum class Device { kCpu, kCuda };

using Shape = std::vector<int64_t>;

enum class DType { kF32, kBF16 };
const char* dtype_name(DType dtype);  // "fp32", "bf16"
inline size_t dtype_size(DType dtype) {
  return dtype == DType::kBF16 ? sizeof(bf16_bits) : sizeof(float);
}

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // A new tensor from the caching allocator; contents are uninitialised.
  static Tensor empty(const Shape& shape, Device device = Device::kCpu, DType dtype = DType::kF32);
  static Tensor zeros(const Shape& shape, Device device = Device::kCpu, DType dtype = DType::kF32);
  // A host tensor in page-locked memory when the build has CUDA (fast, truly asynchronous copies
  // to and from the GPU), in ordinary host memory otherwise.
  static Tensor empty_pinned(const Shape& shape);
  // A non-owning view of `data`. REQUIRES: `data` outlives every copy of the result.
  static Tensor wrap(float* data, const Shape& shape, Device device = Device::kCpu);
  static Tensor wrap(bf16_bits* data, const Shape& shape, Device device = Device::kCpu);

  // REQUIRES: dtype() is kF32 (data) or kBF16 (bf16_data); throws ft::Error otherwise.
  float* data() { return static_cast<float*>(typed_data(DType::kF32)); }
  const float* data() const { return static_cast<const float*>(typed_data(DType::kF32)); }
  bf16_bits* bf16_data() { return static_cast<bf16_bits*>(typed_data(DType::kBF16)); }
  const bf16_bits* bf16_data() const {
    return static_cast<const bf16_bits*>(typed_data(DType::kBF16));
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int axis) const;
  Device device() const { return device_; }
  // True for a default Tensor too (no storage, 0 elements): test numel() to ask "allocated?".
  bool defined() const { return base_ != nullptr || numel_ == 0; }
  size_t bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

  // Same storage, new shape. REQUIRES: same numel.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) along axis 0, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;

  // On cuda both enqueue on the compute stream (core/cuda/cuda_context.h); a copy with a host side
  // returns once the host buffer may be used.
  void fill(float value);                // bf16: the value rounded to bf16
  void copy_from(const Tensor& source);  // REQUIRES: same numel and dtype; any devices.
  // A new tensor on `device` with this one's contents; a host vector of them (bf16 widened).
  Tensor to(Device device) const;
  std::vector<float> to_host_vector() const;

 private:
  static Tensor allocate(const Shape& shape, Device device, DType dtype,
                         CachingAllocator& allocator);
  void* typed_data(DType dtype) const {
    if (dtype != dtype_) throw_dtype_mismatch(dtype);
    return static_cast<char*>(base_) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
  }
  [[noreturn]] void throw_dtype_mismatch(DType asked) const;

  std::shared_ptr<void> storage_;  // keeps base_ alive; null for wrapped tensors
  void* base_ = nullptr;
  int64_t offset_ = 0;  // elements
  DType dtype_ = DType::kF32;
  int64_t numel_ = 0;
  Shape shape_;
  Device device_ = Device::kCpu;
};

}  // namespace ft
