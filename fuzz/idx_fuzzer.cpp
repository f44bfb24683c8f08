// libFuzzer target: the IDX reader (core/idx.cpp), raw and gzip.
// Input: the bytes of a file, read with read_idx from a memfd. An input that is not gzip is also
// read gzip-compressed (zlib, as `gzip` writes it): the two reads must agree, so the fuzzer's
// mutations of the IDX header and payload reach the inflate path too. A file that reads must hold
// size == product(dims) bytes. Refusals (ft::Error) are fine.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/idx.h"
#include "fuzz/fuzz_util.h"

namespace {

// `bytes` as one gzip member (deflate with a gzip header and trailer).
std::string gzip(const uint8_t* bytes, size_t size) {
  z_stream stream{};
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK)
    ft_fuzz::finding("deflateInit2 failed");
  std::string out(deflateBound(&stream, size) + 32, '\0');
  stream.next_in = const_cast<Bytef*>(bytes);
  stream.avail_in = static_cast<uInt>(size);
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) ft_fuzz::finding("deflate did not finish");
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

struct Read {
  bool ok = false;
  std::string error;
  ft::IdxArray array;
};

Read read_file(const void* bytes, size_t size) {
  Read read;
  const ft_fuzz::MemFile file(bytes, size);
  try {
    read.array = ft::read_idx(file.path());
    read.ok = true;
  } catch (const ft::Error& error) {
    read.error = error.what();
  }
  if (read.ok) {
    uint64_t elements = 1;
    for (int32_t dim : read.array.dims) {
      if (dim <= 0) ft_fuzz::finding("read_idx returned a dim <= 0");
      elements *= static_cast<uint64_t>(dim);
    }
    if (read.array.dims.empty() || read.array.data.size() != elements)
      ft_fuzz::finding("read_idx returned data whose size is not the product of its dims");
  }
  return read;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Read raw = read_file(data, size);
  const bool is_gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (is_gzip) return 0;
  const std::string compressed = gzip(data, size);
  const Read inflated = read_file(compressed.data(), compressed.size());
  if (raw.ok != inflated.ok)
    ft_fuzz::finding("read_idx " + std::string(raw.ok ? "accepts" : "refuses") +
                     " the raw file but " + (inflated.ok ? "accepts" : "refuses") +
                     " it gzip-compressed" + (raw.ok ? ": " + inflated.error : ": " + raw.error));
  if (raw.ok && (raw.array.dims != inflated.array.dims || raw.array.data != inflated.array.data))
    ft_fuzz::finding("read_idx reads the raw file and its gzip-compressed copy differently");
  return 0;
}
