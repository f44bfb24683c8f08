// libFuzzer target: the safetensors reader (core/safetensors.cpp, core/safetensors_file.cpp) as
// checkpoints and exports are read, metadata included.
// Input: the bytes of a file. Each input is read twice, from memory (decode_safetensors) and as a
// file (load_safetensors on a memfd, which checks sizes before reading the data section); the two
// must agree. A file that reads must encode again (encode_safetensors) to bytes that decode to
// the same tensors (dtype, F32 or BF16, included) and metadata. Its metadata then goes where
// checkpoints' and exports' goes today without the model code: the embedded "config" through
// parse_config, as checkpoint_config (app/training/checkpoint.cpp) and `sample --model` read it.
// Refusals (ft::Error) are fine.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "app/config/config.h"
#include "core/check.h"
#include "core/safetensors.h"
#include "fuzz/fuzz_util.h"

namespace {

bool same_tensors(const ft::SafetensorsFile& a, const ft::SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (auto ia = a.tensors.begin(), ib = b.tensors.begin(); ia != a.tensors.end(); ++ia, ++ib) {
    if (ia->first != ib->first || ia->second.shape != ib->second.shape ||
        ia->second.dtype != ib->second.dtype || ia->second.data.size() != ib->second.data.size())
      return false;
    // Bitwise: NaN payloads must survive too (BF16 ones through the widening and back).
    if (!ia->second.data.empty() && std::memcmp(ia->second.data.data(), ib->second.data.data(),
                                                ia->second.data.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

void check_metadata(const ft::SafetensorsFile& file) {
  auto config = file.metadata.find("config");
  if (config == file.metadata.end()) return;
  try {
    ft::parse_config(config->second, "fuzz.safetensors (embedded config)");
  } catch (const ft::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ft_fuzz::silence_stdout();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);

  ft::SafetensorsFile from_memory;
  bool memory_ok = true;
  std::string memory_error;
  try {
    from_memory = ft::decode_safetensors(bytes, "fuzz.safetensors");
  } catch (const ft::Error& error) {
    memory_ok = false;
    memory_error = error.what();
  }

  ft::SafetensorsFile from_file;
  bool file_ok = true;
  std::string file_error;
  {
    const ft_fuzz::MemFile file(data, size);
    try {
      from_file = ft::load_safetensors(file.path());
    } catch (const ft::Error& error) {
      file_ok = false;
      file_error = error.what();
    }
  }

  if (memory_ok != file_ok)
    ft_fuzz::finding("decode_safetensors and load_safetensors disagree: decode " +
                     (memory_ok ? "accepts" : "refuses (" + memory_error + ")") + ", load " +
                     (file_ok ? "accepts" : "refuses (" + file_error + ")"));
  if (!memory_ok) return 0;
  if (!same_tensors(from_memory, from_file))
    ft_fuzz::finding("decode_safetensors and load_safetensors read different contents");

  std::string encoded;
  try {
    encoded = ft::encode_safetensors(from_memory);
  } catch (const ft::Error& error) {
    ft_fuzz::finding("a file that decodes does not encode again: " + std::string(error.what()));
  }
  ft::SafetensorsFile again;
  try {
    again = ft::decode_safetensors(encoded, "fuzz.safetensors (re-encoded)");
  } catch (const ft::Error& error) {
    ft_fuzz::finding("encode_safetensors's output does not decode: " + std::string(error.what()));
  }
  if (!same_tensors(from_memory, again))
    ft_fuzz::finding("encode_safetensors's output decodes to other contents");

  check_metadata(from_memory);
  return 0;
}
