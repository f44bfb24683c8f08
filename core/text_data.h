// Byte-level text data for the GPT-2 model (vocabulary = 256 byte values).
// TextDataset holds a whole file in memory split into train (leading bytes) and validation
// (the last round(size * val_fraction) bytes). TextBatcher cuts one rank's training shard into
// (input, target) windows; eval_window_batch cuts fixed, non-overlapping windows for validation.
//
// Training windows are seq_len + 1 bytes: inputs = the first seq_len, targets = the last seq_len.
// Sharding: rank r of N owns the contiguous train byte range [r*S/N, (r+1)*S/N), S = train size;
// shard_len below is the length of that range.
//  - shuffle = true: every window start is drawn uniformly from [0, shard_len - seq_len - 1]
//    with the rank's Rng(seed + 1000003 * rank).
//  - shuffle = false: windows are contiguous and in file order: window j (counting across batches,
//    j = k*B + b for batch k, row b) starts at (j * seq_len) mod (shard_len - seq_len).
// Start offsets are relative to the rank's shard.
// Thread safety: TextDataset is immutable after load and safe to share; a TextBatcher is not.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"

namespace ft {

struct TokenBatch {
  int batch = 0, seq_len = 0;
  std::vector<int32_t> inputs, targets;  // [batch * seq_len] each; targets = inputs shifted by one
};

// Largest corpus TextDataset::load reads (2 GiB): the whole file is held in memory.
inline constexpr uint64_t kMaxTextDataBytes = uint64_t{1} << 31;

class TextDataset {
 public:
  // REQUIRES: 0 <= val_fraction < 1. Throws ft::Error naming the path when the file is missing,
  // unreadable, not a regular file (a device such as /dev/zero, a pipe), larger than
  // kMaxTextDataBytes, empty, or too short to give each split at least 2 bytes.
  static TextDataset load(const std::string& path, float val_fraction);
  // Builds from memory (tests, synthetic corpora); `name` appears in error messages.
  static TextDataset from_bytes(std::vector<uint8_t> bytes, float val_fraction,
                                const std::string& name);

  size_t train_size() const { return train_size_; }
  size_t val_size() const { return bytes_.size() - train_size_; }
  // Pointers stay valid for the dataset's lifetime.
  const uint8_t* train_bytes() const { return bytes_.data(); }
  const uint8_t* val_bytes() const { return bytes_.data() + train_size_; }
  const std::string& name() const { return name_; }

 private:
  std::vector<uint8_t> bytes_;
  size_t train_size_ = 0;
  std::string name_;
};

class TextBatcher {
 public:
  // `data` must outlive the batcher. Throws ft::Error when rank/world/batch/seq_len are out of
  // range or the rank's shard is shorter than seq_len + 1 bytes.
  TextBatcher(const TextDataset& data, int rank, int world_size, int batch, int seq_len,
              bool shuffle, uint64_t seed);

  // Fills `out` with the next training batch (out->batch = batch, out->seq_len = seq_len).
  void next(TokenBatch* out);

  // Checkpoint state: restoring both reproduces the batches that would have followed.
  std::array<uint64_t, 4> rng_state() const { return rng_.state(); }
  void set_rng_state(const std::array<uint64_t, 4>& state) { rng_.set_state(state); }
  uint64_t batches_taken() const { return batches_taken_; }
  void set_batches_taken(uint64_t batches) { batches_taken_ = batches; }

  size_t shard_begin() const {
    return shard_begin_;
  }  // offset of this rank's shard in the train split
  size_t shard_len() const { return shard_len_; }

 private:
  const uint8_t* shard_ = nullptr;
  size_t shard_begin_ = 0, shard_len_ = 0;
  int batch_ = 0, seq_len_ = 0;
  bool shuffle_ = false;
  Rng rng_;
  uint64_t batches_taken_ = 0;
};

// Number of consecutive, non-overlapping (seq_len + 1)-byte windows in num_bytes; a short last
// window is dropped. Window w covers bytes [w*(seq_len+1), (w+1)*(seq_len+1)).
size_t count_eval_windows(size_t num_bytes, int seq_len);

// Fills `out` with windows first_window, first_window + 1, ... (at most `batch` of them, fewer at
// the end); out->batch = how many were filled, 0 when first_window is the window count.
// REQUIRES: first_window <= count_eval_windows(num_bytes, seq_len).
void eval_window_batch(const uint8_t* bytes, size_t num_bytes, int seq_len, size_t first_window,
                       int batch, TokenBatch* out);

// Shannon entropy of the byte histogram of bytes[0, n), in bits (0 for n == 0). A model that
// learns only byte frequencies reaches this loss (in bits), so training must go below it.
double unigram_entropy_bits(const uint8_t* bytes, size_t n);

}  // namespace ft
