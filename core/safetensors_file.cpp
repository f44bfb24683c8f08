// Reading a safetensors file from disk with bounds: load_safetensors checks the file's type and
// size against its header before reading the data section, then decodes it with
// decode_safetensors (core/safetensors.cpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "core/check.h"
#include "core/safetensors.h"
#include "core/safetensors_internal.h"

namespace ft {
namespace {

using safetensors_internal::header_length;
using safetensors_internal::Json;
using safetensors_internal::kMetadataKey;
using safetensors_internal::parse_header;
using safetensors_internal::to_count;

// Reads exactly `count` bytes at the current offset of `fd`; false at a premature end of file.
bool read_fully(int fd, char* out, size_t count, const std::string& path) {
  size_t done = 0;
  while (done < count) {
    const ssize_t got = ::read(fd, out + done, count - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) FT_FAIL(path, ": cannot read: ", std::strerror(errno));
    if (got == 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

// The largest data_offsets end in a parsed header (0 when it lists no tensors); entries whose
// offsets are malformed are left for decode_safetensors to report.
uint64_t data_extent(const Json& header) {
  uint64_t extent = 0;
  for (auto item = header.begin(); item != header.end(); ++item) {
    if (item.key() == kMetadataKey || !item.value().is_object()) continue;
    auto offsets = item.value().find("data_offsets");
    int64_t end = 0;
    if (offsets != item.value().end() && offsets->is_array() && offsets->size() == 2 &&
        to_count((*offsets)[1], &end))
      extent = std::max(extent, static_cast<uint64_t>(end));
  }
  return extent;
}

// The file's bytes, read only after its size (fstat) agrees with the header: a device such as
// /dev/zero, or a header promising more (or less) data than the file holds, is refused before
// anything beyond the header is read, so memory use never exceeds the file's real size.
std::string read_safetensors_bytes(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise block forever before the S_ISREG
  // check below could refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) FT_FAIL("cannot read '", path, "': ", std::strerror(errno));
  FdCloser closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) FT_FAIL("cannot read '", path, "': fstat: ", std::strerror(errno));
  if (!S_ISREG(info.st_mode))
    FT_FAIL(path, ": not a regular file (",
            S_ISDIR(info.st_mode)    ? "a directory"
            : S_ISFIFO(info.st_mode) ? "a pipe"
                                     : "a device or socket",
            "); a safetensors file or checkpoint must be a file of known size");
  // Blocking reads from here on (O_NONBLOCK does nothing on a regular file, but say what we mean).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  if (size < 8)
    FT_FAIL(path, ": not a safetensors file: only ", size,
            " bytes, less than the 8-byte header length (truncated?)");
  std::string bytes(8, '\0');
  if (!read_fully(fd, bytes.data(), 8, path))
    FT_FAIL(path, ": file shrank while reading its 8-byte header length");
  const uint64_t header_bytes = header_length(bytes.data(), size - 8, path);
  bytes.resize(8 + header_bytes);
  if (!read_fully(fd, bytes.data() + 8, header_bytes, path))
    FT_FAIL(path, ": file shrank while reading its ", header_bytes, "-byte header");
  const uint64_t data_bytes = size - 8 - header_bytes;
  const uint64_t extent =
      data_extent(parse_header(std::string_view(bytes.data() + 8, header_bytes), path));
  if (extent != data_bytes)
    FT_FAIL(path, ": file has ", data_bytes,
            " data bytes after its header, but its tensors end at byte ", extent, " (",
            extent > data_bytes ? "truncated" : "trailing garbage", " or corrupt file)");
  bytes.resize(size);
  if (!read_fully(fd, bytes.data() + 8 + header_bytes, data_bytes, path))
    FT_FAIL(path, ": file shrank while reading its ", data_bytes, "-byte data section");
  char extra = 0;
  if (read_fully(fd, &extra, 1, path))
    FT_FAIL(path, ": file grew while being read; it is being written by another process?");
  return bytes;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  return decode_safetensors(read_safetensors_bytes(path), path);
}

}  // namespace ft
