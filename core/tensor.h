// Tensor: a float32 n-d array on a device, row-major and contiguous. Views (reshape, row slices,
// wrapped external buffers) share storage, which is how parameters live inside one flat buffer.
// Thread safety: a Tensor is a value; concurrent reads are fine, writes need outside ordering.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ft {

class CachingAllocator;

enum class Device { kCpu, kCuda };

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // A new tensor from the caching allocator; contents are uninitialised.
  static Tensor empty(const Shape& shape, Device device = Device::kCpu);
  static Tensor zeros(const Shape& shape, Device device = Device::kCpu);
  // A host tensor in page-locked memory when the build has CUDA (fast, truly asynchronous copies
  // to and from the GPU), in ordinary host memory otherwise.
  static Tensor empty_pinned(const Shape& shape);
  // A non-owning view of `data`. REQUIRES: `data` outlives every copy of the result.
  static Tensor wrap(float* data, const Shape& shape, Device device = Device::kCpu);

  float* data() { return base_ + offset_; }
  const float* data() const { return base_ + offset_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int axis) const;
  Device device() const { return device_; }
  // True for a default Tensor too (no storage, 0 elements): test numel() to ask "allocated?".
  bool defined() const { return base_ != nullptr || numel_ == 0; }
  size_t bytes() const { return static_cast<size_t>(numel_) * sizeof(float); }

  // Same storage, new shape. REQUIRES: same numel.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) along axis 0, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;

  // On cuda both enqueue on the compute stream (core/cuda/cuda_context.h); a copy with a host side
  // returns once the host buffer may be used.
  void fill(float value);
  void copy_from(const Tensor& source);  // REQUIRES: same numel; any devices.
  // A new tensor on `device` with this one's contents; a host vector of them.
  Tensor to(Device device) const;
  std::vector<float> to_host_vector() const;

 private:
  static Tensor allocate(const Shape& shape, Device device, CachingAllocator& allocator);

  std::shared_ptr<void> storage_;  // keeps base_ alive; null for wrapped tensors
  float* base_ = nullptr;
  int64_t offset_ = 0;
  int64_t numel_ = 0;
  Shape shape_;
  Device device_ = Device::kCpu;
};

}  // namespace ft
