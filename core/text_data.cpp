#include "core/text_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/atomic_file.h"
#include "core/check.h"

namespace ft {
namespace {

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

struct FdCloser {
  int fd;  // -1 once ownership has passed on
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// Whole regular files only, at most kMaxTextDataBytes: a device such as /dev/zero or a pipe has
// no size to check up front and could be read until memory runs out.
std::vector<uint8_t> read_whole_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO with no writer would otherwise block forever before the S_ISREG
  // check below could refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int open_errno = errno;
    std::error_code error;
    const std::string working_dir = std::filesystem::current_path(error).string();
    const bool relative = std::filesystem::path(path).is_relative();
    // Only the project's own corpus is one that scripts/bootstrap.sh can fetch.
    const bool ours = std::filesystem::path(path).filename() == "moby_dick.txt";
    FT_FAIL("text data file ", path, ": cannot open (", std::strerror(open_errno), ")",
            relative ? "; a relative data.path is looked up from the working directory (" +
                           working_dir + ") and from the config file's folder and those above it"
                     : std::string(),
            ours ? "; run scripts/bootstrap.sh to fetch the corpus" : "");
  }
  FdCloser closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    FT_FAIL("text data file ", path, ": cannot stat (", std::strerror(errno), ")");
  if (!S_ISREG(info.st_mode))
    FT_FAIL("text data file ", path, ": is ", file_kind(info.st_mode),
            ", not a regular file; text data must be a file of known size");
  // Blocking reads from here on (O_NONBLOCK does nothing on a regular file, but say what we mean).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::unique_ptr<std::FILE, FileCloser> file(::fdopen(fd, "rb"));
  if (!file) FT_FAIL("text data file ", path, ": cannot open (", std::strerror(errno), ")");
  closer.fd = -1;  // the FILE owns it now
  if (static_cast<uint64_t>(info.st_size) > kMaxTextDataBytes)
    FT_FAIL("text data file ", path, ": ", info.st_size, " bytes, over the ", kMaxTextDataBytes,
            "-byte (2 GiB) limit for a corpus held in memory");
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(info.st_size));
  uint8_t chunk[1 << 16];
  for (;;) {
    const size_t got = std::fread(chunk, 1, sizeof(chunk), file.get());
    bytes.insert(bytes.end(), chunk, chunk + got);
    if (bytes.size() > kMaxTextDataBytes)  // the file grew while being read
      FT_FAIL("text data file ", path, ": more than ", kMaxTextDataBytes,
              " bytes (the 2 GiB limit for a corpus held in memory)");
    if (got < sizeof(chunk)) break;
  }
  if (std::ferror(file.get())) FT_FAIL("text data file ", path, ": read error");
  return bytes;
}

void fill_window(const uint8_t* window, int seq_len, int32_t* inputs, int32_t* targets) {
  for (int t = 0; t < seq_len; ++t) {
    inputs[t] = window[t];
    targets[t] = window[t + 1];
  }
}

}  // namespace

TextDataset TextDataset::load(const std::string& path, float val_fraction) {
  return from_bytes(read_whole_file(path), val_fraction, path);
}

TextDataset TextDataset::from_bytes(std::vector<uint8_t> bytes, float val_fraction,
                                    const std::string& name) {
  if (!(val_fraction >= 0.0f && val_fraction < 1.0f)) {
    FT_FAIL("text data ", name, ": val_fraction is ", val_fraction, " (allowed 0 <= value < 1)");
  }
  if (bytes.empty()) FT_FAIL("text data file ", name, ": file is empty");
  const size_t total = bytes.size();
  // Rounded, because a float fraction like 0.1f is slightly off and floor would lose a byte.
  const auto val_size = static_cast<size_t>(
      std::llround(static_cast<double>(total) * static_cast<double>(val_fraction)));
  const size_t train_size = total - val_size;
  // 2 bytes is the least that gives one (input, target) pair.
  if (train_size < 2 || (val_fraction > 0.0f && val_size < 2)) {
    FT_FAIL("text data file ", name, ": too short (", total, " bytes give ", train_size,
            " train and ", val_size, " validation bytes with val_fraction ", val_fraction,
            "; each split needs at least 2)");
  }
  TextDataset data;
  data.bytes_ = std::move(bytes);
  data.train_size_ = train_size;
  data.name_ = name;
  return data;
}

TextBatcher::TextBatcher(const TextDataset& data, int rank, int world_size, int batch, int seq_len,
                         bool shuffle, uint64_t seed)
    : batch_(batch), seq_len_(seq_len), shuffle_(shuffle), rng_(seed + 1000003ull * rank) {
  FT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank ", rank, " of world size ",
           world_size);
  FT_CHECK(batch >= 1, "batch size is ", batch, " (must be >= 1)");
  FT_CHECK(seq_len >= 1, "seq_len is ", seq_len, " (must be >= 1)");
  const size_t total = data.train_size();
  shard_begin_ = total * static_cast<size_t>(rank) / static_cast<size_t>(world_size);
  const size_t shard_end = total * static_cast<size_t>(rank + 1) / static_cast<size_t>(world_size);
  shard_len_ = shard_end - shard_begin_;
  shard_ = data.train_bytes() + shard_begin_;
  if (shard_len_ < static_cast<size_t>(seq_len) + 1) {
    FT_FAIL("text data ", data.name(), ": rank ", rank, " of ", world_size, " gets a ", shard_len_,
            "-byte train shard, shorter than one window of seq_len + 1 = ", seq_len + 1,
            " bytes; use a shorter seq_len, fewer ranks or a larger file");
  }
}

void TextBatcher::next(TokenBatch* out) {
  out->batch = batch_;
  out->seq_len = seq_len_;
  out->inputs.resize(static_cast<size_t>(batch_) * seq_len_);
  out->targets.resize(out->inputs.size());
  const uint64_t num_starts =
      shard_len_ - static_cast<uint64_t>(seq_len_);  // valid starts: [0, num_starts)
  for (int b = 0; b < batch_; ++b) {
    uint64_t start;
    if (shuffle_) {
      start = rng_.below_u64(num_starts);
    } else {
      const uint64_t j = batches_taken_ * static_cast<uint64_t>(batch_) + static_cast<uint64_t>(b);
      // (j mod m) * seq_len < m * seq_len fits in 64 bits, unlike j * seq_len for huge j.
      start = (j % num_starts) * static_cast<uint64_t>(seq_len_) % num_starts;
    }
    const size_t row = static_cast<size_t>(b) * seq_len_;
    fill_window(shard_ + start, seq_len_, out->inputs.data() + row, out->targets.data() + row);
  }
  ++batches_taken_;
}

size_t count_eval_windows(size_t num_bytes, int seq_len) {
  FT_CHECK(seq_len >= 1, "seq_len is ", seq_len, " (must be >= 1)");
  return num_bytes / (static_cast<size_t>(seq_len) + 1);
}

void eval_window_batch(const uint8_t* bytes, size_t num_bytes, int seq_len, size_t first_window,
                       int batch, TokenBatch* out) {
  FT_CHECK(batch >= 1, "batch size is ", batch, " (must be >= 1)");
  const size_t windows = count_eval_windows(num_bytes, seq_len);
  FT_CHECK(first_window <= windows, "first_window ", first_window, " is past the ", windows,
           " eval windows");
  const size_t filled = std::min(static_cast<size_t>(batch), windows - first_window);
  const size_t stride = static_cast<size_t>(seq_len) + 1;
  out->batch = static_cast<int>(filled);
  out->seq_len = seq_len;
  out->inputs.resize(filled * seq_len);
  out->targets.resize(filled * seq_len);
  for (size_t b = 0; b < filled; ++b) {
    fill_window(bytes + (first_window + b) * stride, seq_len, out->inputs.data() + b * seq_len,
                out->targets.data() + b * seq_len);
  }
}

double unigram_entropy_bits(const uint8_t* bytes, size_t n) {
  if (n == 0) return 0.0;
  size_t counts[256] = {};
  for (size_t i = 0; i < n; ++i) ++counts[bytes[i]];
  double entropy = 0.0;
  for (size_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / static_cast<double>(n);
    entropy -= p * std::log2(p);
  }
  return entropy;
}

}  // namespace ft
