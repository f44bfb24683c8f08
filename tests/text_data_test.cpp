// Tests for core/text_data.h and core/rng.h: sharding, the shuffle=false window rule, determinism,
// checkpoint resume, eval windows, file errors and unigram entropy.
#include "core/text_data.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "core/check.h"
#include "tests/fifo_test_util.h"

namespace ft {
namespace {

// Bytes whose value encodes their position (mod 251, a prime), so a window's content reveals
// where it starts.
std::vector<uint8_t> position_bytes(size_t n) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i % 251);
  return bytes;
}

// Random bytes: an 8-byte window almost surely occurs only once, so content identifies position.
std::vector<uint8_t> random_bytes(size_t n) {
  Rng rng(77);
  std::vector<uint8_t> bytes(n);
  for (auto& byte : bytes) byte = static_cast<uint8_t>(rng.below(256));
  return bytes;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("ft_text_data_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Window start (relative to the shard) of row b, found by matching the row against the shard.
size_t find_start(const TextBatcher& batcher, const TextDataset& data, const TokenBatch& batch,
                  int b) {
  const uint8_t* shard = data.train_bytes() + batcher.shard_begin();
  const int T = batch.seq_len;
  for (size_t s = 0; s + T + 1 <= batcher.shard_len(); ++s) {
    bool same = true;
    for (int t = 0; t < T && same; ++t) {
      same =
          batch.inputs[b * T + t] == shard[s + t] && batch.targets[b * T + t] == shard[s + t + 1];
    }
    if (same) return s;
  }
  return SIZE_MAX;
}

TEST(Rng, StateRoundTripAndNormalMoments) {
  Rng a(42);
  for (int i = 0; i < 10; ++i) a.normal();
  const auto saved = a.state();
  const float x1 = a.normal(), x2 = a.uniform();
  const uint32_t x3 = a.below(7);
  Rng b(1);
  b.set_state(saved);
  EXPECT_EQ(b.normal(), x1);
  EXPECT_EQ(b.uniform(), x2);
  EXPECT_EQ(b.below(7), x3);

  Rng c(7);
  double sum = 0, squares = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double z = c.normal();
    sum += z;
    squares += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(squares / n, 1.0, 0.05);
}

TEST(Rng, BelowStaysInRangeAndCoversIt) {
  Rng rng(3);
  int counts[5] = {};
  for (int i = 0; i < 5000; ++i) {
    const uint32_t v = rng.below(5);
    ASSERT_LT(v, 5u);
    ++counts[v];
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
  for (int i = 0; i < 100; ++i) ASSERT_LT(rng.below_u64(5'000'000'000ull), 5'000'000'000ull);
}

TEST(Rng, HashUniformIsDeterministicAndInRange) {
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const float u = hash_uniform(9, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    ASSERT_EQ(hash_u32(9, i), hash_u32(9, i));
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
  EXPECT_NE(hash_u32(9, 0), hash_u32(10, 0));
  EXPECT_NE(hash_u32(9, 0), hash_u32(9, 1));
}

TEST(TextDataset, SplitsTrainThenValidation) {
  const TextDataset data = TextDataset::from_bytes(position_bytes(1000), 0.1f, "mem");
  EXPECT_EQ(data.train_size(), 900u);
  EXPECT_EQ(data.val_size(), 100u);
  EXPECT_EQ(data.val_bytes()[0], 900 % 251);
  EXPECT_EQ(data.val_bytes() - data.train_bytes(), 900);
}

TEST(TextDataset, LoadsMobyDick) {
  const std::string path = std::string(FT_SOURCE_DIR) + "/data/moby_dick.txt";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run scripts/bootstrap.sh";
  const TextDataset data = TextDataset::load(path, 0.1f);
  EXPECT_EQ(data.train_size() + data.val_size(), 1204997u);
  EXPECT_NEAR(static_cast<double>(data.val_size()), 120499.7, 1.0);
  const double entropy = unigram_entropy_bits(data.train_bytes(), data.train_size());
  EXPECT_GT(entropy, 3.5);  // English text sits around 4.5 bits per byte
  EXPECT_LT(entropy, 5.5);
}

TEST(TextDataset, MissingEmptyAndShortFilesFailClearly) {
  const std::string missing = temp_path("missing.txt");
  try {
    TextDataset::load(missing, 0.1f);
    FAIL() << "missing file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
  const std::string empty = temp_path("empty.txt");
  { std::ofstream(empty, std::ios::binary); }
  try {
    TextDataset::load(empty, 0.1f);
    FAIL() << "empty file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
  const std::string tiny = temp_path("tiny.txt");
  { std::ofstream(tiny, std::ios::binary) << "abc"; }
  EXPECT_THROW(TextDataset::load(tiny, 0.5f), Error);
  EXPECT_THROW(TextDataset::from_bytes(position_bytes(100), 1.0f, "mem"), Error);
  std::filesystem::remove(empty);
  std::filesystem::remove(tiny);
}

TEST(TextDataset, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = temp_path("fifo.txt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::string message =
      fifo_test::error_reading_fifo(fifo, [&] { TextDataset::load(fifo, 0.1f); });
  EXPECT_NE(message.find("text data file " + fifo + ": is a pipe, not a regular file"),
            std::string::npos)
      << message;
  std::filesystem::remove(fifo);
}

TEST(TextBatcher, ShardsAreDisjointAndCoverTrainSplit) {
  const TextDataset data = TextDataset::from_bytes(random_bytes(1003), 0.0f, "mem");
  size_t expected_begin = 0;
  for (int r = 0; r < 3; ++r) {
    TextBatcher batcher(data, r, 3, 2, 8, true, 1);
    EXPECT_EQ(batcher.shard_begin(), expected_begin);
    EXPECT_EQ(batcher.shard_begin(), 1003u * r / 3);
    expected_begin += batcher.shard_len();
    // Every window of every batch lies inside the rank's shard.
    TokenBatch batch;
    size_t lowest = SIZE_MAX, highest = 0;
    for (int k = 0; k < 1000; ++k) {
      batcher.next(&batch);
      for (int b = 0; b < batch.batch; ++b) {
        const size_t start = find_start(batcher, data, batch, b);
        ASSERT_NE(start, SIZE_MAX) << "rank " << r << " row " << b << " is not inside its shard";
        lowest = std::min(lowest, start);
        highest = std::max(highest, start);
      }
    }
    // Shuffled starts reach both ends of [0, shard_len - seq_len - 1].
    EXPECT_EQ(lowest, 0u);
    EXPECT_EQ(highest, batcher.shard_len() - 8 - 1);
  }
  EXPECT_EQ(expected_begin, data.train_size());
}

TEST(TextBatcher, UnshuffledWindowsFollowTheDocumentedRule) {
  // Shard positions are unique mod 251 only within 251 bytes, so use a shard shorter than that.
  const TextDataset data = TextDataset::from_bytes(position_bytes(2 * 200), 0.0f, "mem");
  const int B = 3, T = 7;
  TextBatcher batcher(data, 1, 2, B, T, false, 5);
  const uint64_t shard_len = batcher.shard_len();
  ASSERT_EQ(shard_len, 200u);
  TokenBatch batch;
  for (uint64_t k = 0; k < 40;
       ++k) {  // 40*3*7 = 840 bytes: wraps the 193 valid starts several times
    batcher.next(&batch);
    ASSERT_EQ(batch.batch, B);
    ASSERT_EQ(batch.seq_len, T);
    for (int b = 0; b < B; ++b) {
      const uint64_t j = k * B + b;
      const uint64_t start = (j * T) % (shard_len - T);
      const uint8_t* shard = data.train_bytes() + batcher.shard_begin();
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(batch.inputs[b * T + t], shard[start + t]) << "k " << k << " b " << b;
        ASSERT_EQ(batch.targets[b * T + t], shard[start + t + 1]) << "k " << k << " b " << b;
      }
    }
  }
}

TEST(TextBatcher, SameSeedSameBatchesAndResumeReproduces) {
  const TextDataset data = TextDataset::from_bytes(position_bytes(5000), 0.1f, "mem");
  TextBatcher a(data, 0, 2, 4, 16, true, 11), b(data, 0, 2, 4, 16, true, 11);
  TextBatcher other_rank(data, 1, 2, 4, 16, true, 11), other_seed(data, 0, 2, 4, 16, true, 12);
  TokenBatch xa, xb, xc;
  for (int k = 0; k < 5; ++k) {
    a.next(&xa);
    b.next(&xb);
    ASSERT_EQ(xa.inputs, xb.inputs);
    ASSERT_EQ(xa.targets, xb.targets);
  }
  other_seed.next(&xc);
  TextBatcher fresh(data, 0, 2, 4, 16, true, 11);
  TokenBatch first;
  fresh.next(&first);
  EXPECT_NE(first.inputs, xc.inputs);

  const auto saved_state = a.rng_state();
  const uint64_t saved_taken = a.batches_taken();
  EXPECT_EQ(saved_taken, 5u);
  a.next(&xa);
  TextBatcher resumed(data, 0, 2, 4, 16, true, 999);
  resumed.set_rng_state(saved_state);
  resumed.set_batches_taken(saved_taken);
  resumed.next(&xb);
  EXPECT_EQ(xa.inputs, xb.inputs);

  TextBatcher plain(data, 0, 2, 4, 16, false, 0), plain_resumed(data, 0, 2, 4, 16, false, 0);
  for (int k = 0; k < 3; ++k) plain.next(&xa);
  plain_resumed.set_batches_taken(plain.batches_taken());
  plain.next(&xa);
  plain_resumed.next(&xb);
  EXPECT_EQ(xa.inputs, xb.inputs);
}

TEST(TextBatcher, RejectsShardShorterThanAWindow) {
  const TextDataset data = TextDataset::from_bytes(position_bytes(100), 0.0f, "mem");
  EXPECT_THROW(TextBatcher(data, 0, 4, 1, 25, false, 0), Error);  // 25-byte shard, 26-byte window
  EXPECT_NO_THROW(TextBatcher(data, 0, 4, 1, 24, false, 0));
  EXPECT_THROW(TextBatcher(data, 4, 4, 1, 8, false, 0), Error);
}

TEST(EvalWindows, CountAndContent) {
  const std::vector<uint8_t> bytes = position_bytes(100);
  EXPECT_EQ(count_eval_windows(100, 9), 10u);  // exactly 10 windows of 10
  EXPECT_EQ(count_eval_windows(99, 9), 9u);    // short last window dropped
  EXPECT_EQ(count_eval_windows(5, 9), 0u);
  TokenBatch batch;
  eval_window_batch(bytes.data(), 99, 9, 0, 4, &batch);
  ASSERT_EQ(batch.batch, 4);
  ASSERT_EQ(batch.inputs.size(), 36u);
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t < 9; ++t) {
      EXPECT_EQ(batch.inputs[b * 9 + t], b * 10 + t);
      EXPECT_EQ(batch.targets[b * 9 + t], b * 10 + t + 1);
    }
  }
  eval_window_batch(bytes.data(), 99, 9, 8, 4, &batch);
  ASSERT_EQ(batch.batch, 1);  // only window 8 remains
  EXPECT_EQ(batch.inputs[0], 80);
  EXPECT_EQ(batch.targets[8], 89);
  eval_window_batch(bytes.data(), 99, 9, 9, 4, &batch);
  EXPECT_EQ(batch.batch, 0);
  EXPECT_THROW(eval_window_batch(bytes.data(), 99, 9, 10, 4, &batch), Error);
}

TEST(UnigramEntropy, UniformIsEightBitsAndConstantIsZero) {
  std::vector<uint8_t> uniform(256);
  for (int i = 0; i < 256; ++i) uniform[i] = static_cast<uint8_t>(i);
  EXPECT_NEAR(unigram_entropy_bits(uniform.data(), uniform.size()), 8.0, 1e-12);
  const uint8_t aaaa[] = {'a', 'a', 'a', 'a'};
  EXPECT_EQ(unigram_entropy_bits(aaaa, 4), 0.0);
  const uint8_t ab[] = {'a', 'b', 'a', 'b'};
  EXPECT_NEAR(unigram_entropy_bits(ab, 4), 1.0, 1e-12);
}

}  // namespace
}  // namespace ft
