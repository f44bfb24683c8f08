// Tests for core/image_data.h on the real Fashion-MNIST files: loading checks, normalisation,
// labels, flips, shard disjointness, determinism and checkpoint resume.
#include "core/image_data.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <utility>

#include "core/check.h"

namespace ft {
namespace {

// Loads once per test binary; a missing package fails loudly instead of skipping.
const ImageDataset& train_set() {
  static const ImageDataset data = [] {
    const std::string probe = std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz";
    if (!std::filesystem::exists(probe)) {
      ADD_FAILURE() << probe << " is missing: run scripts/bootstrap.sh (installs the Debian "
                    << "package dataset-fashion-mnist)";
    }
    return ImageDataset::load_fashion_mnist(kFashionMnistDir, true);
  }();
  return data;
}

float normalised(const ImageDataset& data, ChannelStats stats, int index, int pixel) {
  return (static_cast<float>(data.image(index)[pixel]) / 255.0f - stats.mean) / stats.stddev;
}

IdxArray idx(std::vector<int32_t> dims, std::vector<uint8_t> data) {
  return IdxArray{dims, data};
}

TEST(ImageDataset, LoadsBothSplits) {
  const ImageDataset& train = train_set();
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(train.height(), 28);
  EXPECT_EQ(train.width(), 28);
  const ImageDataset test = ImageDataset::load_fashion_mnist(kFashionMnistDir, false);
  EXPECT_EQ(test.size(), 10000);
  for (int i = 0; i < test.size(); ++i) ASSERT_LT(test.label(i), 10);
  EXPECT_THROW(train.image(60000), Error);
  EXPECT_THROW(train.label(-1), Error);
}

TEST(ImageDataset, MissingDirectoryNamesBootstrap) {
  try {
    ImageDataset::load_fashion_mnist("/nonexistent/fashion", true);
    FAIL() << "loaded from a missing directory";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("/nonexistent/fashion/train-images-idx3-ubyte.gz"), std::string::npos)
        << message;
    EXPECT_NE(message.find("scripts/bootstrap.sh"), std::string::npos) << message;
  }
}

TEST(ImageDataset, RejectsInconsistentArrays) {
  const std::vector<uint8_t> four_pixels(2 * 2 * 2, 7);
  EXPECT_NO_THROW(
      ImageDataset::from_idx(idx({2, 2, 2}, four_pixels), idx({2}, {0, 9}), 2, 2, "ok"));
  EXPECT_THROW(ImageDataset::from_idx(idx({2, 2, 2}, four_pixels), idx({3}, {0, 1, 2}), 2, 2, "n"),
               Error);  // count mismatch
  EXPECT_THROW(ImageDataset::from_idx(idx({2, 2, 2}, four_pixels), idx({2}, {0, 10}), 2, 2, "l"),
               Error);  // label out of range
  EXPECT_THROW(ImageDataset::from_idx(idx({2, 2, 2}, four_pixels), idx({2}, {0, 1}), 28, 28, "s"),
               Error);  // not 28x28
  EXPECT_THROW(ImageDataset::from_idx(idx({8}, four_pixels), idx({2}, {0, 1}), 2, 2, "d"), Error);
}

// The message of the ft::Error that from_idx throws for these arrays.
std::string from_idx_error(IdxArray images, IdxArray labels, const std::string& name) {
  try {
    ImageDataset::from_idx(std::move(images), std::move(labels), 2, 2, name);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no ft::Error thrown>";
}

TEST(ImageDataset, LabelErrorsNameTheLabelsFileWhenThereIsOne) {
  const std::vector<uint8_t> four_pixels(2 * 2 * 2, 7);
  IdxArray from_file = idx({2}, {0, 10});
  from_file.path = "lab_bad.idx";
  EXPECT_EQ(from_idx_error(idx({2, 2, 2}, four_pixels), from_file, "img.idx"),
            "labels file lab_bad.idx: label 1 is 10 (allowed 0..9)");
  EXPECT_EQ(from_idx_error(idx({2, 2, 2}, four_pixels), idx({2}, {0, 10}), "img.idx"),
            "image data img.idx (labels): label 1 is 10 (allowed 0..9)");
  IdxArray three = idx({3}, {0, 1, 2});
  three.path = "lab3.idx";
  EXPECT_EQ(from_idx_error(idx({2, 2, 2}, four_pixels), three, "img.idx"),
            "image data img.idx: 2 images but 3 labels in lab3.idx");
}

TEST(ImageData, TrainStatsMatchKnownValues) {
  const ChannelStats stats = fashion_mnist_train_stats(train_set());
  // Published Fashion-MNIST statistics: mean 0.2860, std 0.3530.
  EXPECT_NEAR(stats.mean, 0.2860, 1e-3);
  EXPECT_NEAR(stats.stddev, 0.3530, 1e-3);
}

TEST(ImageBatcher, NormalisedBatchesHaveZeroMeanUnitStdAndRightLabels) {
  const ImageDataset& data = train_set();
  const ChannelStats stats = fashion_mnist_train_stats(data);
  ImageBatcher batcher(data, stats, 0, 1, 256, true, false, 3);
  ImageBatch batch;
  double sum = 0, squares = 0;
  size_t count = 0;
  for (int k = 0; k < 4; ++k) {
    batcher.next(&batch);
    ASSERT_EQ(batch.batch, 256);
    ASSERT_EQ(batch.images.size(), 256u * 28 * 28);
    for (int b = 0; b < batch.batch; ++b) {
      ASSERT_EQ(batch.labels[b], data.label(batch.indices[b]));
      ASSERT_FLOAT_EQ(batch.images[b * 784 + 400], normalised(data, stats, batch.indices[b], 400));
    }
    for (float v : batch.images) {
      sum += v;
      squares += static_cast<double>(v) * v;
    }
    count += batch.images.size();
  }
  const double mean = sum / count;
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(squares / count - mean * mean), 1.0, 0.05);
}

TEST(ImageBatcher, FlipMirrorsAboutHalfTheImages) {
  const ImageDataset& data = train_set();
  const ChannelStats stats{0.5f, 0.25f};
  ImageBatcher batcher(data, stats, 0, 1, 200, true, true, 4);
  ImageBatch batch;
  batcher.next(&batch);
  int mirrored = 0;
  for (int b = 0; b < batch.batch; ++b) {
    const int index = batch.indices[b];
    bool same = true, flipped = true;
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) {
        const float v = batch.images[b * 784 + y * 28 + x];
        same = same && v == normalised(data, stats, index, y * 28 + x);
        flipped = flipped && v == normalised(data, stats, index, y * 28 + 27 - x);
      }
    }
    ASSERT_TRUE(same || flipped) << "row " << b << " is neither the image nor its mirror";
    mirrored += flipped && !same;
  }
  EXPECT_GT(mirrored, 60);
  EXPECT_LT(mirrored, 140);
}

TEST(ImageBatcher, ShardsAreDisjointAndEachEpochIsAPermutation) {
  const ImageDataset& data = train_set();
  const ChannelStats stats = fashion_mnist_train_stats(data);
  const int world = 3, batch_size = 1000;
  std::vector<int> owner(data.size(), -1);
  for (int r = 0; r < world; ++r) {
    ImageBatcher batcher(data, stats, r, world, batch_size, true, false, 5);
    ASSERT_EQ(batcher.shard_size(), 20000);
    ImageBatch batch;
    std::vector<int32_t> first_epoch;
    for (int k = 0; k < 20; ++k) {
      batcher.next(&batch);
      first_epoch.insert(first_epoch.end(), batch.indices.begin(), batch.indices.end());
    }
    for (int index : first_epoch) {
      ASSERT_EQ(owner[index], -1) << "index " << index << " seen twice (ranks " << owner[index]
                                  << " and " << r << ")";
      owner[index] = r;
      ASSERT_GE(index, batcher.shard_begin());
      ASSERT_LT(index, batcher.shard_begin() + batcher.shard_size());
    }
    batcher.next(&batch);  // epoch 2 starts with a different order
    EXPECT_NE(std::vector<int32_t>(first_epoch.begin(), first_epoch.begin() + batch_size),
              batch.indices);
  }
  for (int index = 0; index < data.size(); ++index) ASSERT_NE(owner[index], -1) << index;
}

TEST(ImageBatcher, UnshuffledVisitsShardInOrderAndWrapsEpochs) {
  const ImageDataset& data = train_set();
  ImageBatcher batcher(data, {0.5f, 0.5f}, 2, 3, 7000, false, false, 0);
  ImageBatch batch;
  std::vector<int32_t> seen;
  for (int k = 0; k < 3; ++k) {
    batcher.next(&batch);
    seen.insert(seen.end(), batch.indices.begin(), batch.indices.end());
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 40000 + static_cast<int>(i % 20000));
}

TEST(ImageBatcher, DeterministicAndResumable) {
  const ImageDataset& data = train_set();
  const ChannelStats stats = fashion_mnist_train_stats(data);
  ImageBatcher a(data, stats, 1, 2, 7000, true, true, 8), b(data, stats, 1, 2, 7000, true, true, 8);
  ImageBatch xa, xb;
  // 30000 samples per shard: after 5 batches (35000 samples) we are inside the second epoch.
  for (int k = 0; k < 5; ++k) {
    a.next(&xa);
    b.next(&xb);
    ASSERT_EQ(xa.indices, xb.indices);
    ASSERT_EQ(xa.images, xb.images);
  }
  for (int steps : {0, 1}) {  // resume mid-epoch, then exactly on an epoch boundary
    if (steps) {
      ImageBatcher boundary(data, stats, 0, 2, 10000, true, true, 8);
      for (int k = 0; k < 3; ++k) boundary.next(&xa);  // 30000 samples = one full epoch
      a = boundary;
    }
    const auto state = a.rng_state();
    const uint64_t position = a.position();
    a.next(&xa);
    ImageBatcher resumed(data, stats, steps ? 0 : 1, 2, steps ? 10000 : 7000, true, true, 8);
    resumed.set_position(position);
    resumed.set_rng_state(state);
    resumed.next(&xb);
    EXPECT_EQ(xa.indices, xb.indices) << "resume case " << steps;
    EXPECT_EQ(xa.images, xb.images) << "resume case " << steps;
  }
}

TEST(ImageEval, BatchesInOrderWithoutAugmentation) {
  const ImageDataset& data = train_set();
  const ChannelStats stats = fashion_mnist_train_stats(data);
  ImageBatch batch;
  image_eval_batch(data, stats, 59990, 32, &batch);
  ASSERT_EQ(batch.batch, 10);  // only 10 images left
  for (int b = 0; b < batch.batch; ++b) {
    EXPECT_EQ(batch.labels[b], data.label(59990 + b));
    EXPECT_FLOAT_EQ(batch.images[b * 784 + 3], normalised(data, stats, 59990 + b, 3));
  }
  image_eval_batch(data, stats, 60000, 32, &batch);
  EXPECT_EQ(batch.batch, 0);
  EXPECT_THROW(image_eval_batch(data, stats, 60001, 32, &batch), Error);
  EXPECT_THROW(image_eval_batch(data, {0.5f, 0.0f}, 0, 32, &batch), Error);
}

}  // namespace
}  // namespace ft
