// Tests for core/idx.h: the real Fashion-MNIST files, hand-built good files (gzip and raw), and
// every malformed input ending in a clear ft::Error that names the file.
#include "core/idx.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <thread>
#include <utility>

#include "core/check.h"
#include "core/image_data.h"
#include "tests/fifo_test_util.h"

namespace ft {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("ft_idx_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

std::vector<uint8_t> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// A valid 2x3 ubyte IDX file holding 10, 11, ..., 15.
std::vector<uint8_t> tiny_idx() {
  return {0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3, 10, 11, 12, 13, 14, 15};
}

// Expects read_idx(path) to throw an ft::Error whose message names the file and contains `what`.
void expect_idx_error(const std::string& path, const std::string& what) {
  try {
    read_idx(path);
    ADD_FAILURE() << path << " was accepted; expected an error about '" << what << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

class IdxFiles : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const auto& path : created_) std::filesystem::remove(path);
  }
  std::string raw(const std::string& name, const std::vector<uint8_t>& bytes) {
    created_.push_back(temp_path(name));
    write_raw(created_.back(), bytes);
    return created_.back();
  }
  std::string gz(const std::string& name, const std::vector<uint8_t>& bytes) {
    created_.push_back(temp_path(name));
    write_gz(created_.back(), bytes);
    return created_.back();
  }
  std::vector<std::string> created_;
};

TEST_F(IdxFiles, ReadsTinyFileRawAndGzip) {
  for (const std::string& path : {raw("tiny.idx", tiny_idx()), gz("tiny.idx.gz", tiny_idx())}) {
    const IdxArray array = read_idx(path);
    EXPECT_EQ(array.dims, (std::vector<int32_t>{2, 3})) << path;
    EXPECT_EQ(array.data, (std::vector<uint8_t>{10, 11, 12, 13, 14, 15})) << path;
  }
}

TEST_F(IdxFiles, MissingFile) {
  expect_idx_error(temp_path("nonexistent.gz"), "cannot open");
}

TEST_F(IdxFiles, PipesAndDirectoriesAreRefusedWithoutBlocking) {
  created_.push_back(temp_path("fifo.idx"));
  const std::string fifo = created_.back();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::string message = fifo_test::error_reading_fifo(fifo, [&] { read_idx(fifo); });
  EXPECT_NE(message.find("IDX file " + fifo + ": is a pipe, not a regular file"), std::string::npos)
      << message;
  expect_idx_error(std::filesystem::temp_directory_path().string(),
                   "is a directory, not a regular file");
}

TEST_F(IdxFiles, LabelErrorsNameTheLabelsFile) {
  const std::string images =
      raw("images.idx", {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 7, 7});
  const std::string bad_label = raw("labels_200.idx", {0, 0, 0x08, 1, 0, 0, 0, 2, 0, 200});
  const std::string three_dims =
      raw("labels_3d.idx", {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1});
  EXPECT_EQ(read_idx(images).path, images);
  for (const auto& [labels, what] : {std::pair{bad_label, ": label 1 is 200 (allowed 0..9)"},
                                     std::pair{three_dims, ": has 3 dimensions (expected 1"}}) {
    try {
      ImageDataset::from_idx(read_idx(images), read_idx(labels), 1, 1, images);
      ADD_FAILURE() << labels << " was accepted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("labels file " + labels + what), std::string::npos) << message;
      EXPECT_EQ(message.find(images), std::string::npos) << message;
    }
  }
}

TEST_F(IdxFiles, TruncatedPayloadAndHeader) {
  std::vector<uint8_t> bytes = tiny_idx();
  bytes.pop_back();
  expect_idx_error(raw("short.idx", bytes), "truncated payload");
  expect_idx_error(gz("short.idx.gz", bytes), "truncated payload");
  expect_idx_error(raw("header.idx", {0, 0, 0x08, 2, 0, 0}),
                   "truncated while reading the dimension");
  expect_idx_error(raw("empty.idx", {}), "truncated while reading the 4-byte magic");
}

TEST_F(IdxFiles, TrailingBytes) {
  std::vector<uint8_t> bytes = tiny_idx();
  bytes.push_back(99);
  expect_idx_error(raw("long.idx", bytes), "1 trailing bytes");
  expect_idx_error(gz("long.idx.gz", bytes), "1 trailing bytes");
}

TEST_F(IdxFiles, BadMagicAndType) {
  std::vector<uint8_t> bytes = tiny_idx();
  bytes[0] = 0x1f;
  expect_idx_error(raw("magic.idx", bytes), "bad magic");
  bytes = tiny_idx();
  bytes[2] = 0x0D;  // float32: a valid IDX type we do not support
  expect_idx_error(raw("float.idx", bytes), "unsupported element type 0xd");
  expect_idx_error(raw("text.idx", {'h', 'e', 'l', 'l', 'o', '\n'}), "bad magic");
}

TEST_F(IdxFiles, WrongDims) {
  std::vector<uint8_t> bytes = tiny_idx();
  bytes[3] = 0;
  expect_idx_error(raw("ndim0.idx", bytes), "number of dimensions is 0");
  bytes[3] = 5;
  expect_idx_error(raw("ndim5.idx", bytes), "number of dimensions is 5");
  bytes = tiny_idx();
  bytes[7] = 0;  // first dim 0
  expect_idx_error(raw("zero.idx", bytes), "dimension 0 is 0");
  bytes = tiny_idx();
  bytes[8] = 0x80;  // second dim negative as int32: printed as the unsigned value in the file
  expect_idx_error(raw("negative.idx", bytes), "dimension 1 is 2147483651 (must be in 1..");
  bytes = tiny_idx();
  for (int i = 4; i < 8; ++i) bytes[i] = 0xff;
  expect_idx_error(raw("all_ones.idx", bytes), "dimension 0 is 4294967295 (must be in 1..");
  // 65536 x 65536 = 2^32 elements: rejected from the header, before allocating anything.
  expect_idx_error(raw("huge.idx", {0, 0, 0x08, 2, 0, 1, 0, 0, 0, 1, 0, 0, 1, 2, 3}),
                   "dimensions multiply to more than");
}

TEST_F(IdxFiles, CorruptGzipStream) {
  // A compressible payload so the deflate stream has room for corruption in the middle.
  std::vector<uint8_t> bytes = {0, 0, 0x08, 1, 0, 0, 0x10, 0};
  for (int i = 0; i < 4096; ++i) bytes.push_back(static_cast<uint8_t>((i * 7) % 13));
  const std::string good = gz("good.idx.gz", bytes);
  ASSERT_EQ(read_idx(good).data.size(), 4096u);
  const std::vector<uint8_t> compressed = read_raw(good);
  ASSERT_GT(compressed.size(), 40u);

  std::vector<uint8_t> bad_crc = compressed;
  bad_crc[bad_crc.size() - 8] ^= 0xFF;  // CRC-32 trailer
  expect_idx_error(raw("crc.idx.gz", bad_crc), "gzip stream is corrupt");

  std::vector<uint8_t> cut(compressed.begin(), compressed.begin() + compressed.size() / 2);
  expect_idx_error(raw("cut.idx.gz", cut), "gzip stream is corrupt or truncated");

  // Flipping bytes inside the deflate data must end in some error (zlib's or ours), never a crash
  // or a silent success.
  for (size_t offset = 12; offset < compressed.size() - 8; offset += 3) {
    std::vector<uint8_t> flipped = compressed;
    flipped[offset] ^= 0x5A;
    const std::string path = raw("flip.idx.gz", flipped);
    EXPECT_THROW(read_idx(path), Error) << "flip at offset " << offset;
  }
}

TEST(IdxFashionMnist, ReadsRealFiles) {
  const std::string dir = kFashionMnistDir;
  const std::string images = dir + "/train-images-idx3-ubyte.gz";
  const std::string labels = dir + "/t10k-labels-idx1-ubyte.gz";
  ASSERT_TRUE(std::filesystem::exists(images))
      << images << " is missing: run scripts/bootstrap.sh (installs dataset-fashion-mnist)";
  ASSERT_TRUE(std::filesystem::exists(labels))
      << labels << " is missing: run scripts/bootstrap.sh (installs dataset-fashion-mnist)";
  const IdxArray train_images = read_idx(images);
  EXPECT_EQ(train_images.dims, (std::vector<int32_t>{60000, 28, 28}));
  EXPECT_EQ(train_images.data.size(), 60000u * 28 * 28);
  const IdxArray test_labels = read_idx(labels);
  EXPECT_EQ(test_labels.dims, (std::vector<int32_t>{10000}));
  int counts[10] = {};
  for (uint8_t label : test_labels.data) {
    ASSERT_LT(label, 10);
    ++counts[label];
  }
  for (int c : counts) EXPECT_EQ(c, 1000);  // the test split is balanced
}

}  // namespace
}  // namespace ft
