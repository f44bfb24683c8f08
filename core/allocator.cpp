#include "core/allocator.h"

#include <cstdint>
#include <cstdlib>
#include <iomanip>

#include "core/check.h"

namespace ft {
namespace {

void* aligned_host_allocate(size_t bytes) {
  void* ptr = std::aligned_alloc(64, bytes);
  // User-facing: a size too large for this machine comes from the config or flags, not a bug.
  if (ptr == nullptr)
    throw OutOfMemory(
        detail::concat("out of host memory allocating ", std::fixed, std::setprecision(1),
                       static_cast<double>(bytes) / (uint64_t{1} << 30), " GiB (", bytes,
                       " bytes); reduce train.batch_size, model sizes or bench/bandwidth sizes"));
  return ptr;
}

}  // namespace

CachingAllocator::CachingAllocator() : CachingAllocator(aligned_host_allocate, std::free) {}

CachingAllocator::CachingAllocator(RawAllocate raw_allocate, RawRelease raw_release)
    : raw_allocate_(raw_allocate), raw_release_(raw_release) {}

CachingAllocator& CachingAllocator::host() {
  static CachingAllocator* allocator = new CachingAllocator();  // never destroyed: outlives statics
  return *allocator;
}

CachingAllocator::~CachingAllocator() {
  trim();
}

size_t CachingAllocator::round_up(size_t bytes) {
  // Exact sizes below 1 MiB are rounded to 512 B; larger ones to 64 KiB, so that a block can serve
  // a slightly smaller request without wasting much.
  const size_t granule = bytes < (1u << 20) ? 512 : (64u << 10);
  return ((bytes + granule - 1) / granule) * granule;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t rounded = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_blocks_.find(rounded);
  void* ptr = nullptr;
  if (it != free_blocks_.end()) {
    ptr = it->second;
    free_blocks_.erase(it);
    stats_.bytes_cached -= rounded;
  } else {
    ptr = raw_allocate_(rounded);
    ++stats_.os_allocations;
  }
  stats_.bytes_in_use += rounded;
  if (stats_.bytes_in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.bytes_in_use;
  return ptr;
}

void CachingAllocator::release(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const size_t rounded = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (holding_) {
    held_.emplace_back(ptr, rounded);
    return;
  }
  free_blocks_.emplace(rounded, ptr);
  stats_.bytes_in_use -= rounded;
  stats_.bytes_cached += rounded;
}

void CachingAllocator::begin_hold() {
  std::lock_guard<std::mutex> lock(mutex_);
  FT_CHECK(!holding_, "CachingAllocator::begin_hold while already holding");
  holding_ = true;
}

CachingAllocator::HeldBlocks CachingAllocator::end_hold() {
  std::lock_guard<std::mutex> lock(mutex_);
  FT_CHECK(holding_, "CachingAllocator::end_hold without begin_hold");
  holding_ = false;
  HeldBlocks blocks;
  blocks.swap(held_);
  return blocks;
}

void CachingAllocator::return_held(const HeldBlocks& blocks) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [ptr, rounded] : blocks) {
    free_blocks_.emplace(rounded, ptr);
    stats_.bytes_in_use -= rounded;
    stats_.bytes_cached += rounded;
  }
}

void CachingAllocator::trim() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, ptr] : free_blocks_) raw_release_(ptr);
  free_blocks_.clear();
  stats_.bytes_cached = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace ft
