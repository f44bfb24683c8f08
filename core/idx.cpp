// IDX layout: 2 zero bytes, type byte, ndim byte, ndim big-endian int32 dims, then the payload.
#include "core/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/check.h"

namespace ft {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
constexpr int kMaxDims = 4;
constexpr uint64_t kMaxElements = (uint64_t{1} << 31) - 1;

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

struct FdCloser {
  int fd;  // -1 once ownership has passed on
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// `path` opened for reading, refused unless it is a regular file, like every other data file.
// O_NONBLOCK keeps open() of a FIFO with no writer from blocking forever before fstat can refuse
// it.
std::FILE* open_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) FT_FAIL("IDX file ", path, ": cannot open (", std::strerror(errno), ")");
  FdCloser closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    FT_FAIL("IDX file ", path, ": cannot stat (", std::strerror(errno), ")");
  if (!S_ISREG(info.st_mode)) {
    FT_FAIL("IDX file ", path, ": is ",
            S_ISDIR(info.st_mode)    ? "a directory"
            : S_ISFIFO(info.st_mode) ? "a pipe"
                                     : "a device or socket",
            ", not a regular file; IDX data must be a file");
  }
  // Blocking reads from here on (O_NONBLOCK does nothing on a regular file, but say what we mean).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::FILE* file = ::fdopen(fd, "rb");
  if (file == nullptr) FT_FAIL("IDX file ", path, ": cannot open (", std::strerror(errno), ")");
  closer.fd = -1;  // the FILE owns it now
  return file;
}

// The bytes of an IDX file, inflated when it starts with the gzip magic 0x1f 0x8b. Unlike gzread,
// which treats running out of input as a clean end, a gzip member counts as complete only when
// inflate reaches Z_STREAM_END, i.e. after its CRC32 and ISIZE trailer checked out.
class IdxSource {
 public:
  explicit IdxSource(const std::string& path) : path_(path), input_(1 << 17) {
    file_.reset(open_regular_file(path));
    fill_input();
    gzip_ = available() >= 2 && input_[0] == 0x1f && input_[1] == 0x8b;
    if (gzip_ && inflateInit2(&stream_, 15 + 16) != Z_OK)
      FT_FAIL("IDX file ", path, ": cannot start zlib (out of memory)");
  }
  ~IdxSource() {
    if (gzip_) inflateEnd(&stream_);
  }
  IdxSource(const IdxSource&) = delete;
  IdxSource& operator=(const IdxSource&) = delete;

  // Reads up to `count` bytes; a short return means a clean end of data.
  size_t read(uint8_t* out, size_t count) {
    return gzip_ ? inflate_some(out, count) : copy_some(out, count);
  }

 private:
  size_t available() const { return input_end_ - input_pos_; }

  // Refills the input buffer when it is empty; false at the end of the file.
  bool fill_input() {
    if (available() > 0) return true;
    input_pos_ = 0;
    input_end_ = std::fread(input_.data(), 1, input_.size(), file_.get());
    if (std::ferror(file_.get()))
      FT_FAIL("IDX file ", path_, ": read error (", std::strerror(errno), ")");
    return input_end_ > 0;
  }

  size_t copy_some(uint8_t* out, size_t count) {
    size_t done = 0;
    while (done < count && fill_input()) {
      const size_t take = std::min(count - done, available());
      std::memcpy(out + done, input_.data() + input_pos_, take);
      input_pos_ += take;
      done += take;
    }
    return done;
  }

  size_t inflate_some(uint8_t* out, size_t count) {
    size_t done = 0;
    while (done < count) {
      if (member_done_) {
        if (!fill_input()) break;  // clean end: every member ended with a valid trailer
        if (input_[input_pos_] != 0x1f)
          FT_FAIL("IDX file ", path_,
                  ": trailing data after the end of the gzip stream (corrupt file?)");
        inflateReset(&stream_);  // another gzip member follows, as gzip allows
        member_done_ = false;
      }
      if (!fill_input())
        FT_FAIL("IDX file ", path_,
                ": gzip stream is corrupt or truncated: the file ends before the end of the "
                "compressed data and its CRC32/ISIZE trailer");
      const size_t want = std::min<size_t>(count - done, size_t{1} << 30);
      stream_.next_in = input_.data() + input_pos_;
      stream_.avail_in = static_cast<uInt>(available());
      stream_.next_out = out + done;
      stream_.avail_out = static_cast<uInt>(want);
      const int code = inflate(&stream_, Z_NO_FLUSH);
      input_pos_ = input_end_ - stream_.avail_in;
      done += want - stream_.avail_out;
      if (code == Z_STREAM_END) {
        member_done_ = true;
      } else if (code != Z_OK && !(code == Z_BUF_ERROR && available() == 0)) {
        FT_FAIL("IDX file ", path_,
                ": gzip stream is corrupt (zlib: ", stream_.msg ? stream_.msg : zError(code), ")");
      }
    }
    return done;
  }

  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::vector<uint8_t> input_;
  size_t input_pos_ = 0, input_end_ = 0;
  bool gzip_ = false, member_done_ = false;
  z_stream stream_{};
};

void read_exact(IdxSource& source, const std::string& path, uint8_t* out, size_t count,
                const char* what) {
  const size_t got = source.read(out, count);
  if (got != count) {
    FT_FAIL("IDX file ", path, ": truncated while reading ", what, " (expected ", count,
            " bytes, got ", got, ")");
  }
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  IdxSource source(path);

  uint8_t magic[4];
  read_exact(source, path, magic, sizeof(magic), "the 4-byte magic header");
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
  array.path = path;
  uint64_t elements = 1;
  for (int d = 0; d < ndim; ++d) {
    uint8_t raw[4];
    read_exact(source, path, raw, sizeof(raw), "the dimension sizes");
    const uint32_t value = (uint32_t{raw[0]} << 24) | (uint32_t{raw[1]} << 16) |
                           (uint32_t{raw[2]} << 8) | uint32_t{raw[3]};
    if (value == 0 || value > kMaxElements) {
      FT_FAIL("IDX file ", path, ": dimension ", d, " is ", value, " (must be in 1..", kMaxElements,
              ")");
    }
    elements *=
        value;  // each factor < 2^31 and the running product is capped below, so no overflow
    if (elements > kMaxElements) {
      FT_FAIL("IDX file ", path, ": dimensions multiply to more than ", kMaxElements,
              " elements; the header is corrupt");
    }
    array.dims.push_back(static_cast<int32_t>(value));
  }

  // Grown as bytes arrive, in chunks from 1 MiB doubling to 64 MiB, so a header promising more
  // than the file holds allocates at most about twice what the file has (a header alone once
  // cost a zero-filled 64 MiB chunk: fuzz/findings/idx_header_only_64MiB.idx).
  constexpr size_t kLargestChunk = size_t{64} << 20;
  size_t chunk = size_t{1} << 20;
  size_t got = 0;
  while (got < elements) {
    const size_t want = std::min<size_t>(chunk, static_cast<size_t>(elements) - got);
    array.data.resize(got + want);
    const size_t read = source.read(array.data.data() + got, want);
    got += read;
    if (read < want) break;
    chunk = std::min(chunk * 2, kLargestChunk);
  }
  if (got != elements) {
    FT_FAIL("IDX file ", path, ": truncated payload (dims promise ", elements, " bytes, file has ",
            got, ")");
  }
  uint8_t extra[64];
  const size_t trailing = source.read(extra, sizeof(extra));
  if (trailing != 0) {
    FT_FAIL("IDX file ", path, ": ", trailing == sizeof(extra) ? "at least " : "", trailing,
            " trailing bytes after the ", elements, "-byte payload; dims and data disagree");
  }
  return array;
}

}  // namespace ft
