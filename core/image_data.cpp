#include "core/image_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "core/check.h"

namespace ft {
namespace {

constexpr int kFashionMnistSide = 28;

// Prefers the gzip file the Debian package ships, and accepts an unpacked copy.
std::string find_idx_file(const std::string& dir, const std::string& stem) {
  const std::string base = (std::filesystem::path(dir) / stem).string();
  std::error_code ignored;
  if (std::filesystem::exists(base + ".gz", ignored)) return base + ".gz";
  if (std::filesystem::exists(base, ignored)) return base;
  FT_FAIL("Fashion-MNIST file ", base, ".gz not found (nor ", base,
          "); run scripts/bootstrap.sh, which installs the Debian package dataset-fashion-mnist "
          "into ",
          kFashionMnistDir);
}

// Lookup table pixel byte -> normalised float, so batching is a gather.
std::array<float, 256> normalisation_table(ChannelStats stats) {
  FT_REQUIRE(std::isfinite(stats.mean) && std::isfinite(stats.stddev) && stats.stddev > 0.0f,
             "image normalisation statistics are mean ", stats.mean, " stddev ", stats.stddev,
             "; the stddev must be finite and > 0 (constant images cannot be normalised)");
  std::array<float, 256> table;
  for (int v = 0; v < 256; ++v)
    table[v] = (static_cast<float>(v) / 255.0f - stats.mean) / stats.stddev;
  return table;
}

void copy_image(const ImageDataset& data, int index, bool mirror,
                const std::array<float, 256>& table, float* out) {
  const uint8_t* pixels = data.image(index);
  const int height = data.height(), width = data.width();
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = pixels + static_cast<size_t>(y) * width;
    float* out_row = out + static_cast<size_t>(y) * width;
    for (int x = 0; x < width; ++x) out_row[x] = table[row[mirror ? width - 1 - x : x]];
  }
}

}  // namespace

ImageDataset ImageDataset::load_fashion_mnist(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_path = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_idx_file(dir, prefix + "-labels-idx1-ubyte");
  return from_idx(read_idx(images_path), read_idx(labels_path), kFashionMnistSide,
                  kFashionMnistSide, images_path + " + " + labels_path);
}

ImageDataset ImageDataset::from_idx(IdxArray images, IdxArray labels, int expected_height,
                                    int expected_width, const std::string& name) {
  if (images.dims.size() != 3) {
    FT_FAIL("image data ", name, ": images have ", images.dims.size(),
            " dimensions (expected 3: count, height, width)");
  }
  if (images.dims[1] != expected_height || images.dims[2] != expected_width) {
    FT_FAIL("image data ", name, ": images are ", images.dims[1], "x", images.dims[2],
            " (expected ", expected_height, "x", expected_width, ")");
  }
  // Label errors name the labels file when the labels came from one (infer --labels), not `name`,
  // which is the images file there.
  const std::string labels_source =
      labels.path.empty() ? "image data " + name + " (labels)" : "labels file " + labels.path;
  if (labels.dims.size() != 1) {
    FT_FAIL(labels_source, ": has ", labels.dims.size(),
            " dimensions (expected 1: one label per image)");
  }
  if (images.dims[0] != labels.dims[0]) {
    FT_FAIL("image data ", name, ": ", images.dims[0], " images but ", labels.dims[0], " labels",
            labels.path.empty() ? "" : " in ", labels.path);
  }
  const size_t count = static_cast<size_t>(images.dims[0]);
  if (images.data.size() != count * expected_height * expected_width ||
      labels.data.size() != count) {
    FT_FAIL("image data ", name, ": data sizes (", images.data.size(), " pixels, ",
            labels.data.size(), " labels) do not match the dims");
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kFashionMnistClasses) {
      FT_FAIL(labels_source, ": label ", i, " is ", int{labels.data[i]}, " (allowed 0..",
              kFashionMnistClasses - 1, ")");
    }
  }
  ImageDataset data;
  data.size_ = images.dims[0];
  data.height_ = expected_height;
  data.width_ = expected_width;
  data.name_ = name;
  data.pixels_ = std::move(images.data);
  data.labels_ = std::move(labels.data);
  return data;
}

const uint8_t* ImageDataset::image(int i) const {
  FT_CHECK(i >= 0 && i < size_, "image index ", i, " outside 0..", size_ - 1);
  return pixels_.data() + static_cast<size_t>(i) * height_ * width_;
}

int ImageDataset::label(int i) const {
  FT_CHECK(i >= 0 && i < size_, "label index ", i, " outside 0..", size_ - 1);
  return labels_[static_cast<size_t>(i)];
}

ChannelStats fashion_mnist_train_stats(const ImageDataset& train) {
  FT_CHECK(train.size() > 0, "cannot compute pixel statistics of an empty dataset");
  uint64_t histogram[256] = {};
  for (int i = 0; i < train.size(); ++i) {
    const uint8_t* pixels = train.image(i);
    for (int p = 0; p < train.height() * train.width(); ++p) ++histogram[pixels[p]];
  }
  double count = 0.0, sum = 0.0;
  for (int v = 0; v < 256; ++v) {
    count += static_cast<double>(histogram[v]);
    sum += static_cast<double>(histogram[v]) * (v / 255.0);
  }
  const double mean = sum / count;
  double squares = 0.0;
  for (int v = 0; v < 256; ++v) {
    const double d = v / 255.0 - mean;
    squares += static_cast<double>(histogram[v]) * d * d;
  }
  for (int v = 0; v < 256; ++v) {
    if (static_cast<double>(histogram[v]) == count)
      FT_FAIL("image data ", train.name(), ": every one of the ", train.size(),
              " train images has all pixels equal to ", v,
              "; constant images cannot be normalised (pixel stddev is 0)");
  }
  return ChannelStats{static_cast<float>(mean), static_cast<float>(std::sqrt(squares / count))};
}

ImageBatcher::ImageBatcher(const ImageDataset& data, ChannelStats stats, int rank, int world_size,
                           int batch, bool shuffle, bool flip, uint64_t seed)
    : data_(&data),
      stats_(stats),
      batch_(batch),
      shard_begin_(0),
      shuffle_(shuffle),
      flip_(flip),
      flip_seed_(mix_u64(seed + 1000003ull * static_cast<uint64_t>(rank)) ^ 0x666C6970ull),
      rng_(seed + 1000003ull * static_cast<uint64_t>(rank)),
      epoch_rng_state_(rng_.state()) {
  FT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "rank ", rank, " of world size ",
           world_size);
  FT_CHECK(batch >= 1, "batch size is ", batch, " (must be >= 1)");
  normalisation_table(stats);  // validates stats now rather than at the first batch
  const int64_t n = data.size();
  shard_begin_ = static_cast<int>(n * rank / world_size);
  const int shard_end = static_cast<int>(n * (rank + 1) / world_size);
  if (shard_end <= shard_begin_) {
    FT_FAIL("image data: rank ", rank, " of ", world_size, " gets an empty shard of the ", n,
            "-image dataset; use fewer ranks");
  }
  order_.resize(static_cast<size_t>(shard_end - shard_begin_));
  start_epoch();
}

void ImageBatcher::start_epoch() {
  epoch_rng_state_ = rng_.state();
  // Always from the identity so the permutation depends only on epoch_rng_state_ (resumable).
  std::iota(order_.begin(), order_.end(), shard_begin_);
  if (!shuffle_) return;
  for (size_t i = order_.size() - 1; i > 0; --i) {
    const uint32_t j = rng_.below(static_cast<uint32_t>(i + 1));
    std::swap(order_[i], order_[j]);
  }
}

void ImageBatcher::rebuild_order() {
  rng_.set_state(epoch_rng_state_);
  start_epoch();
}

void ImageBatcher::set_rng_state(const std::array<uint64_t, 4>& state) {
  epoch_rng_state_ = state;
  rebuild_order();
}

void ImageBatcher::set_position(uint64_t samples_taken) {
  samples_taken_ = samples_taken;
}

void ImageBatcher::next(ImageBatch* out) {
  const std::array<float, 256> table = normalisation_table(stats_);
  const size_t pixels = static_cast<size_t>(data_->height()) * data_->width();
  out->batch = batch_;
  out->images.resize(static_cast<size_t>(batch_) * pixels);
  out->labels.resize(static_cast<size_t>(batch_));
  out->indices.resize(static_cast<size_t>(batch_));
  const uint64_t shard_size = order_.size();
  for (int b = 0; b < batch_; ++b) {
    const int index = order_[static_cast<size_t>(samples_taken_ % shard_size)];
    const bool mirror = flip_ && hash_uniform(flip_seed_, samples_taken_) < 0.5f;
    copy_image(*data_, index, mirror, table, out->images.data() + b * pixels);
    out->labels[b] = data_->label(index);
    out->indices[b] = index;
    ++samples_taken_;
    // Advancing eagerly keeps rng_state() in step with position() at epoch boundaries.
    if (samples_taken_ % shard_size == 0) start_epoch();
  }
}

void image_eval_batch(const ImageDataset& data, ChannelStats stats, int first, int batch,
                      ImageBatch* out) {
  FT_CHECK(batch >= 1, "batch size is ", batch, " (must be >= 1)");
  FT_CHECK(first >= 0 && first <= data.size(), "first image ", first, " outside 0..", data.size());
  const std::array<float, 256> table = normalisation_table(stats);
  const int filled = std::min(batch, data.size() - first);
  const size_t pixels = static_cast<size_t>(data.height()) * data.width();
  out->batch = filled;
  out->images.resize(static_cast<size_t>(filled) * pixels);
  out->labels.resize(static_cast<size_t>(filled));
  out->indices.resize(static_cast<size_t>(filled));
  for (int b = 0; b < filled; ++b) {
    copy_image(data, first + b, false, table, out->images.data() + b * pixels);
    out->labels[b] = data.label(first + b);
    out->indices[b] = first + b;
  }
}

}  // namespace ft
