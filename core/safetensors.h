// Reader and writer for the safetensors format (https://github.com/huggingface/safetensors), dtypes
// F32 and BF16: an 8-byte little-endian header length N, an N-byte JSON header padded with spaces
// to a multiple of 8, then the raw little-endian tensor bytes. Output is byte-identical to the
// reference implementation for F32 and BF16 tensors (tensors sorted by name, compact JSON,
// "__metadata__" first and omitted when empty), so PyTorch's `safetensors.torch.load_file` reads
// our checkpoints and exports.
// In memory every tensor is fp32, whatever the file stores: BF16 widens to fp32 exactly on read,
// and an entry or view marked BF16 is rounded to nearest, ties to even (core/math/bf16_math.h) on
// write, so callers that want fp32 never see another type.
// Reading validates everything and throws ft::Error naming the origin and the defect; corrupt
// input never causes a crash, an out-of-bounds read or an allocation beyond twice the input's size
// (BF16 data widens to fp32).
// Thread safety: all functions are reentrant; concurrent saves to one path are not allowed.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

// Re-exported: callers that save checkpoints usually also write small files atomically.
#include "core/atomic_file.h"
#include "core/tensor.h"

namespace ft {

struct SafetensorsEntry {
  std::vector<int64_t> shape;  // {} is a scalar (1 element); a 0 dim makes an empty tensor
  std::vector<float> data;     // row-major; size == product(shape); fp32 whatever `dtype` is
  // What the file holds ("F32" or "BF16"). Saving kBF16 rounds `data` to bf16; a value read from
  // a BF16 tensor is bf16-exact, so it is saved with the same bits (NaN payloads included).
  DType dtype = DType::kF32;
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
  DType dtype = DType::kF32;  // how the file stores it; kBF16 rounds as SafetensorsEntry says
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
