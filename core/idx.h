// Reader for IDX files (the MNIST / Fashion-MNIST container), gzip-compressed or raw.
// Only the unsigned-byte element type (0x08) is accepted; every malformed input (bad magic, bad
// dims, truncated or oversized payload, corrupt gzip stream, a gzip member cut before its CRC32 and
// ISIZE trailer, trailing data) throws ft::Error naming the file.
// Thread safety: read_idx is reentrant; each call opens its own file handle.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ft {

struct IdxArray {
  std::vector<int32_t> dims;  // outermost first, e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // row-major, size == product(dims)
  // The file read_idx read, so later checks (ImageDataset::from_idx) can name it; empty for an
  // array built in memory. Defaulted so that IdxArray{dims, data} stays warning-free.
  std::string path = {};
};

// Reads `path`, which must be a regular file (a pipe, device or directory is refused, without
// blocking on a FIFO that has no writer); zlib decompresses transparently when the file starts with
// the gzip magic, and raw files pass through. Payload larger than 2^31 - 1 elements is rejected
// before any allocation, and the payload buffer grows only as bytes arrive.
IdxArray read_idx(const std::string& path);

}  // namespace ft
