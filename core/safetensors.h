// Reader and writer for the safetensors format (https://github.com/huggingface/safetensors), F32
// only: an 8-byte little-endian header length N, an N-byte JSON header padded with spaces to a
// multiple of 8, then the raw little-endian tensor bytes. Output is byte-identical to the
// reference implementation for F32 tensors (tensors sorted by name, compact JSON, "__metadata__"
// first and omitted when empty), so PyTorch's `safetensors.torch.load_file` reads our checkpoints.
// Reading validates everything and throws ft::Error naming the origin and the defect; corrupt
// input never causes a crash, an out-of-bounds read or an allocation beyond the input's size.
// Thread safety: all functions are reentrant; concurrent saves to one path are not allowed.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

// Re-exported: callers that save checkpoints usually also write small files atomically.
#include "core/atomic_file.h"

namespace ft {

struct SafetensorsEntry {
  std::vector<int64_t> shape;  // {} is a scalar (1 element); a 0 dim makes an empty tensor
  std::vector<float> data;     // row-major; size == product(shape)
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;      // the header's "__metadata__" object
  std::map<std::string, SafetensorsEntry> tensors;  // name -> tensor, sorted by name
};

// A tensor to save without copying it first. Ownership: `data` is borrowed and must stay valid
// and unchanged until the save returns. REQUIRES: host memory; may be null only when numel is 0.
struct SafetensorsView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// Headers larger than this are rejected on read (same limit as the reference implementation).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// The complete file bytes. Throws ft::Error when a shape has a negative dim, data.size() does not
// match the shape, a name is "__metadata__", or a string is not valid UTF-8.
std::string encode_safetensors(const SafetensorsFile& file);

// Parses and validates `bytes`; `origin` (usually the path) prefixes every error message.
SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& origin);

// encode_safetensors + write_file_atomic, without building the whole file in memory.
void save_safetensors(const std::string& path, const SafetensorsFile& file);

// Writes `views` straight from caller memory (e.g. a trainer's flat parameter buffer), atomically.
// Views may come in any order; the header lists them sorted by name. Throws ft::Error on a
// duplicate or reserved name, a negative dim, or a null `data` with a nonzero element count.
void save_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                      const std::vector<SafetensorsView>& views);

// Reads `path` with bounds and decodes it; errors name `path`. Refuses anything that is not a
// regular file (e.g. /dev/zero), a header length over kSafetensorsMaxHeaderBytes, and a file size
// that disagrees with the header's data offsets, each before reading the data section.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace ft
