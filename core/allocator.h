// CachingAllocator: hands out blocks and keeps freed ones for reuse by size, so a training step
// after the first allocates nothing from the OS or the CUDA driver. host() gives 64-byte aligned
// host memory; device() (CUDA builds only, core/cuda/device_memory.cu) gives cudaMalloc memory.
// Thread safety: all methods are safe to call from any thread (one mutex).
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace ft {

struct AllocatorStats {
  size_t bytes_in_use = 0;  // handed out and not yet returned
  size_t bytes_cached = 0;  // returned and kept for reuse
  size_t peak_in_use = 0;
  size_t os_allocations = 0;  // calls that reached the OS
};

class CachingAllocator {
 public:
  static CachingAllocator& host();
#if defined(FT_HAVE_CUDA)
  static CachingAllocator& device();
  static CachingAllocator& pinned();  // page-locked host memory (cudaHostAlloc)
#endif

  // Returns a block of at least `bytes` bytes. Never returns null; throws ft::Error on failure.
  void* allocate(size_t bytes);
  // REQUIRES: `ptr` came from allocate() with the same `bytes`.
  void release(void* ptr, size_t bytes);
  // Returns every cached block to the OS.
  void trim();

  // A captured CUDA graph (core/cuda/cuda_graph.h) replays with the addresses it was captured
  // with, so a temporary block freed during capture is still the graph's: were it cached, a later
  // allocation could be handed memory that every replay overwrites. Between begin_hold() and
  // end_hold() released blocks are set aside (still counted in use) instead of cached; end_hold()
  // hands them to the caller, who gives them back with return_held() once the graph is gone.
  // REQUIRES: holds do not nest.
  using HeldBlocks = std::vector<std::pair<void*, size_t>>;  // block, rounded size
  void begin_hold();
  HeldBlocks end_hold();
  void return_held(const HeldBlocks& blocks);
  AllocatorStats stats() const;

  using RawAllocate = void* (*)(size_t bytes);  // never returns null; throws on failure
  using RawRelease = void (*)(void* ptr);
  CachingAllocator();  // host memory
  CachingAllocator(RawAllocate raw_allocate, RawRelease raw_release);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

 private:
  static size_t round_up(size_t bytes);
  RawAllocate raw_allocate_;
  RawRelease raw_release_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;  // rounded size -> block
  bool holding_ = false;
  HeldBlocks held_;
  AllocatorStats stats_;
};

}  // namespace ft
