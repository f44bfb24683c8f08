// Fashion-MNIST images for the ResNet: loading, normalisation statistics and per-rank batching.
// ImageDataset holds the raw uint8 pixels and labels of one split; ImageBatcher turns one rank's
// shard into normalised float batches [B, 1, H, W], reshuffling the shard every epoch and
// optionally mirroring images left-right; image_eval_batch reads fixed batches for evaluation.
// Thread safety: ImageDataset is immutable after load and safe to share; an ImageBatcher is not.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/idx.h"
#include "core/rng.h"

namespace ft {

// Where the Debian package dataset-fashion-mnist (installed by scripts/bootstrap.sh) puts the
// files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kFashionMnistClasses = 10;

struct ImageBatch {
  int batch = 0;
  std::vector<float> images;     // [batch, 1, height, width], (pixel/255 - mean) / stddev
  std::vector<int32_t> labels;   // [batch], 0..9
  std::vector<int32_t> indices;  // [batch], dataset index of each row (for tests and debugging)
};

class ImageDataset {
 public:
  // Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir`. Throws ft::Error naming
  // the file when one is missing (with a hint to run scripts/bootstrap.sh) or malformed, when
  // image and label counts disagree, when images are not 28x28, or a label is outside 0..9.
  static ImageDataset load_fashion_mnist(const std::string& dir, bool train);
  // Validates and wraps already-read arrays: images {N, H, W}, labels {N}. Errors name `name`,
  // except those about the labels alone, which name labels.path when it is set.
  static ImageDataset from_idx(IdxArray images, IdxArray labels, int expected_height,
                               int expected_width, const std::string& name);

  int size() const { return size_; }
  int height() const { return height_; }
  int width() const { return width_; }
  // REQUIRES: 0 <= i < size(). The pointer addresses height()*width() row-major pixels.
  const uint8_t* image(int i) const;
  int label(int i) const;
  const std::string& name() const { return name_; }  // the files it was read from

 private:
  std::string name_;
  std::vector<uint8_t> pixels_, labels_;
  int size_ = 0, height_ = 0, width_ = 0;
};

struct ChannelStats {
  float mean, stddev;
};

// Mean and (population) standard deviation of every train pixel scaled to [0, 1]. Computed from an
// exact integer histogram, so every rank gets bit-identical values. Throws ft::Error naming the
// data when every pixel has one value (stddev 0 cannot normalise).
ChannelStats fashion_mnist_train_stats(const ImageDataset& train);

class ImageBatcher {
 public:
  // `data` must outlive the batcher. Rank r owns dataset indices [r*N/W, (r+1)*N/W). With shuffle,
  // each epoch visits its shard in a fresh permutation drawn from Rng(seed + 1000003 * rank);
  // without, in index order. Batches are always full: the last batch of an epoch continues into
  // the next. With flip, each sample is mirrored left-right with probability 0.5, decided by a
  // counter-based hash of (seed, rank, sample number) so it needs no extra state.
  ImageBatcher(const ImageDataset& data, ChannelStats stats, int rank, int world_size, int batch,
               bool shuffle, bool flip, uint64_t seed);

  void next(ImageBatch* out);

  // Checkpoint state. rng_state() is the generator state at the start of the current epoch and
  // position() the number of samples taken so far; restoring both (in either order) reproduces
  // the batches that would have followed.
  std::array<uint64_t, 4> rng_state() const { return epoch_rng_state_; }
  void set_rng_state(const std::array<uint64_t, 4>& state);
  uint64_t position() const { return samples_taken_; }
  void set_position(uint64_t samples_taken);

  int shard_begin() const { return shard_begin_; }
  int shard_size() const { return static_cast<int>(order_.size()); }

 private:
  void start_epoch();    // draws the next permutation from rng_
  void rebuild_order();  // recomputes the current permutation from epoch_rng_state_

  const ImageDataset* data_;
  ChannelStats stats_;
  int batch_, shard_begin_;
  bool shuffle_, flip_;
  uint64_t flip_seed_;
  Rng rng_;
  std::array<uint64_t, 4> epoch_rng_state_;
  std::vector<int32_t> order_;  // dataset indices in this epoch's visiting order
  uint64_t samples_taken_ = 0;
};

// Fills `out` with images first .. first+batch-1 (fewer at the end of the dataset), normalised,
// unshuffled and unflipped. REQUIRES: 0 <= first <= data.size(), batch >= 1.
void image_eval_batch(const ImageDataset& data, ChannelStats stats, int first, int batch,
                      ImageBatch* out);

}  // namespace ft
