// IDX layout: 2 zero bytes, type byte, ndim byte, ndim big-endian int32 dims, then the payload.
#include "core/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/check.h"

namespace ft {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
constexpr int kMaxDims = 4;
constexpr uint64_t kMaxElements = (uint64_t{1} << 31) - 1;

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to `count` bytes; returns how many were read. Throws on a zlib/gzip error, so a short
// return means a clean end of data.
size_t read_some(gzFile file, const std::string& path, uint8_t* out, size_t count) {
  size_t done = 0;
  while (done < count) {
    const size_t want = std::min<size_t>(count - done, size_t{1} << 30);
    const int got = gzread(file, out + done, static_cast<unsigned>(want));
    int zlib_code = Z_OK;
    const char* message = gzerror(file, &zlib_code);
    // A truncated gzip member reports Z_BUF_ERROR with a short read instead of a -1 return.
    if (zlib_code == Z_ERRNO) {
      FT_FAIL("IDX file ", path, ": read error (", message ? message : "unknown error", ")");
    }
    if (got < 0 || (zlib_code != Z_OK && zlib_code != Z_STREAM_END)) {
      FT_FAIL("IDX file ", path,
              ": gzip stream is corrupt or truncated (zlib: ", message ? message : "unknown error",
              ")");
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

void read_exact(gzFile file, const std::string& path, uint8_t* out, size_t count,
                const char* what) {
  const size_t got = read_some(file, path, out, count);
  if (got != count) {
    FT_FAIL("IDX file ", path, ": truncated while reading ", what, " (expected ", count,
            " bytes, got ", got, ")");
  }
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  errno = 0;
  GzHandle file(gzopen(path.c_str(), "rb"));
  if (!file) {
    FT_FAIL("IDX file ", path, ": cannot open (", errno ? std::strerror(errno) : "out of memory",
            ")");
  }
  gzbuffer(file.get(), 1 << 17);

  uint8_t magic[4];
  read_exact(file.get(), path, magic, sizeof(magic), "the 4-byte magic header");
  if (magic[0] != 0 || magic[1] != 0) {
    FT_FAIL("IDX file ", path, ": bad magic (first two bytes must be 0x00 0x00, got 0x", std::hex,
            int{magic[0]}, " 0x", int{magic[1]}, "); not an IDX file");
  }
  if (magic[2] != kTypeUnsignedByte) {
    FT_FAIL("IDX file ", path, ": unsupported element type 0x", std::hex, int{magic[2]},
            " (only 0x08 = unsigned byte is supported)");
  }
  const int ndim = magic[3];
  if (ndim < 1 || ndim > kMaxDims) {
    FT_FAIL("IDX file ", path, ": number of dimensions is ", ndim, " (allowed 1..", kMaxDims, ")");
  }

  IdxArray array;
  uint64_t elements = 1;
  for (int d = 0; d < ndim; ++d) {
    uint8_t raw[4];
    read_exact(file.get(), path, raw, sizeof(raw), "the dimension sizes");
    const uint32_t value = (uint32_t{raw[0]} << 24) | (uint32_t{raw[1]} << 16) |
                           (uint32_t{raw[2]} << 8) | uint32_t{raw[3]};
    if (value == 0 || value > kMaxElements) {
      FT_FAIL("IDX file ", path, ": dimension ", d, " is ", static_cast<int32_t>(value),
              " (must be in 1..", kMaxElements, ")");
    }
    elements *=
        value;  // each factor < 2^31 and the running product is capped below, so no overflow
    if (elements > kMaxElements) {
      FT_FAIL("IDX file ", path, ": dimensions multiply to more than ", kMaxElements,
              " elements; the header is corrupt");
    }
    array.dims.push_back(static_cast<int32_t>(value));
  }

  array.data.resize(static_cast<size_t>(elements));
  const size_t got = read_some(file.get(), path, array.data.data(), array.data.size());
  if (got != array.data.size()) {
    FT_FAIL("IDX file ", path, ": truncated payload (dims promise ", elements, " bytes, file has ",
            got, ")");
  }
  uint8_t extra[64];
  const size_t trailing = read_some(file.get(), path, extra, sizeof(extra));
  if (trailing != 0) {
    FT_FAIL("IDX file ", path, ": ", trailing == sizeof(extra) ? "at least " : "", trailing,
            " trailing bytes after the ", elements, "-byte payload; dims and data disagree");
  }
  return array;
}

}  // namespace ft
