// Every bad data file is refused with a message naming the file and the problem, never our source
// (".cpp:"): gzip IDX files cut before their CRC32/ISIZE trailer, constant images, bad magic,
// devices and empty files as text data, validation splits too short for one window, safetensors
// files whose size disagrees with their header, eval --data on a ResNet, and running out of memory
// while building a graph.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>

#include "app/training/task.h"
#include "core/check.h"
#include "core/idx.h"
#include "core/image_data.h"
#include "core/safetensors.h"
#include "core/text_data.h"

namespace ft {
namespace {

const std::string kMnist = "/usr/share/datasets/fashion-mnist/";

std::string temp_dir() {
  const std::string dir = ::testing::TempDir() + "/values_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string write_bytes(const std::string& name, const std::string& bytes) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Runs `body`, expecting an ft::Error whose message holds every one of `parts` and no source path.
template <typename Body>
void expect_error(Body body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "accepted; expected an error with '" << parts.front() << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    EXPECT_EQ(message.find(".cpp:"), std::string::npos) << message;
  }
}

TEST(ValuesIdx, GzipCutBeforeItsTrailerIsRefused) {
  for (const std::string name : {"t10k-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"}) {
    const std::string whole = read_bytes(kMnist + name);
    ASSERT_GT(whole.size(), 8u) << name;
    ASSERT_NO_THROW(read_idx(kMnist + name));
    for (size_t cut : {8, 4, 1}) {
      const std::string path = write_bytes("cut" + std::to_string(cut) + "-" + name,
                                           whole.substr(0, whole.size() - cut));
      expect_error([&] { read_idx(path); },
                   {"IDX file " + path, "gzip stream is corrupt or truncated", "CRC32/ISIZE"});
    }
  }
}

TEST(ValuesIdx, ConcatenatedMembersPassAndTrailingGarbageIsRefused) {
  const std::string labels = read_bytes(kMnist + "t10k-labels-idx1-ubyte.gz");
  // A second gzip member holding nothing: gzip(1) decompresses the concatenation as one stream.
  std::string empty_member;
  {
    const std::string path = temp_dir() + "/empty.gz";
    gzFile file = gzopen(path.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzclose(file), Z_OK);
    empty_member = read_bytes(path);
  }
  EXPECT_EQ(read_idx(write_bytes("two.gz", labels + empty_member)).data.size(), 10000u);
  const std::string garbage = write_bytes("garbage.gz", labels + "garbage");
  expect_error([&] { read_idx(garbage); }, {garbage, "trailing data after the end of the gzip"});
}

TEST(ValuesIdx, BadMagicAndTruncatedHeadersNameTheFile) {
  const std::string magic = write_bytes("magic.idx", std::string("\x01\x02\x08\x01", 4));
  expect_error([&] { read_idx(magic); }, {"IDX file " + magic, "bad magic"});
  const std::string short_header = write_bytes("short.idx", std::string("\x00\x00", 2));
  expect_error([&] { read_idx(short_header); }, {short_header, "truncated"});
  // A header promising 2^31 - 1 bytes over a 3-byte payload: refused without allocating 2 GiB.
  const std::string promise =
      write_bytes("promise.idx", std::string("\x00\x00\x08\x01\x7f\xff\xff\xff\x01\x02\x03", 11));
  expect_error([&] { read_idx(promise); }, {promise, "truncated payload"});
}

IdxArray idx(std::vector<int32_t> dims, uint8_t value) {
  size_t count = 1;
  for (int32_t dim : dims) count *= static_cast<size_t>(dim);
  return IdxArray{std::move(dims), std::vector<uint8_t>(count, value)};
}

TEST(ValuesImages, ConstantImagesAreRefusedByName) {
  for (uint8_t value : {0, 255}) {
    const ImageDataset constant =
        ImageDataset::from_idx(idx({3, 28, 28}, value), idx({3}, 1), 28, 28, "flat.idx");
    expect_error([&] { fashion_mnist_train_stats(constant); },
                 {"image data flat.idx", "all pixels equal to " + std::to_string(value),
                  "cannot be normalised"});
  }
  expect_error(
      [&] {
        image_eval_batch(ImageDataset(), ChannelStats{0.5f, 0.0f}, 0, 1, nullptr);
      },
      {"stddev must be finite and > 0"});
}

TEST(ValuesText, DevicesAndEmptyFilesAreRefused) {
  expect_error([] { TextDataset::load("/dev/zero", 0.1f); },
               {"text data file /dev/zero", "character device", "not a regular file"});
  const std::string empty = write_bytes("empty.txt", "");
  expect_error([&] { TextDataset::load(empty, 0.1f); }, {"text data file " + empty, "empty"});
  expect_error([&] { TextDataset::load(temp_dir(), 0.1f); }, {"a directory"});
}

Config gpt_config(const std::string& data_path, float val_fraction) {
  Config config;
  config.data.path = data_path;
  config.data.val_fraction = val_fraction;
  config.model.n_layer = 1;
  return config;
}

TEST(ValuesText, ValidationSplitMustHoldOneWindow) {
  const std::string text = write_bytes("corpus.txt", std::string(1000, 'a'));
  // 1000 * 0.05 = 50 validation bytes < 65 = seq_len + 1.
  expect_error([&] { make_task(gpt_config(text, 0.05f), 0, 1); },
               {"data.val_fraction = 0.05", "holds out 50 of the 1000 bytes of " + text,
                "model.seq_len + 1 = 65", "at least 0.065"});
  EXPECT_NE(make_task(gpt_config(text, 0.065f), 0, 1), nullptr);
}

TEST(ValuesEval, TextDataNeedsAGptAndOneWindow) {
  ParamStore params;
  GraphCache graphs([](int, GraphMode) -> Graph { throw Error("graph built"); }, params,
                    FusionOptions{});
  Config resnet;
  resnet.model.arch = "resnet";
  const std::string text = write_bytes("short.txt", std::string(10, 'a'));
  expect_error([&] { evaluate_text_file(resnet, graphs, text); },
               {"eval --data " + text, "GPT checkpoints only", "model.arch resnet"});
  expect_error([&] { evaluate_text_file(gpt_config("", 0.1f), graphs, text); },
               {"evaluation text " + text + " has 10 bytes", "model.seq_len + 1 = 65"});
}

TEST(ValuesMemory, OutOfMemoryNamesTheKeysToLower) {
  ParamStore params;
  GraphCache graphs([](int, GraphMode) -> Graph { throw std::bad_alloc(); }, params,
                    FusionOptions{});
  expect_error([&] { graphs.get(4096, GraphMode::kTrain); },
               {"out of memory", "training graph for batch 4096", "train.batch_size",
                "model.d_model", "model.seq_len", "model.resnet_width"});
}

// The allocator's own failure (OutOfMemory, not bad_alloc) gets the same message, and says how
// much in GiB (with no source path) when it is met elsewhere; other errors pass through untouched.
TEST(ValuesMemory, AllocatorFailureNamesTheKeysToLowerToo) {
  const Shape petabytes{int64_t{1} << 48};  // 1 PiB of floats
  expect_error([&] { Tensor::empty(petabytes, Device::kCpu); },
               {"out of host memory allocating 1048576.0 GiB", "reduce train.batch_size"});
  ParamStore params;
  GraphCache huge(
      [&](int, GraphMode) -> Graph {
        Tensor::empty(petabytes, Device::kCpu);
        return Graph();
      },
      params, FusionOptions{});
  expect_error([&] { huge.get(8, GraphMode::kEval); },
               {"out of memory", "evaluation graph for batch 8", "train.batch_size"});
  GraphCache failing([](int, GraphMode) -> Graph { FT_FAIL("not about memory"); }, params,
                     FusionOptions{});
  try {
    failing.get(8, GraphMode::kEval);
    ADD_FAILURE() << "the builder's error was swallowed";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "not about memory");
  }
}

// A one-tensor safetensors file whose header is followed by `data_bytes` bytes.
std::string safetensors_bytes(size_t data_bytes) {
  SafetensorsFile file;
  file.tensors["w"] = SafetensorsEntry{{2}, {1.0f, 2.0f}};
  std::string bytes = encode_safetensors(file);
  bytes.resize(bytes.size() - 8 + data_bytes, '\0');
  return bytes;
}

TEST(ValuesSafetensors, SizeMustAgreeWithTheHeaderBeforeDataIsRead) {
  expect_error([] { load_safetensors("/dev/zero"); }, {"/dev/zero: not a regular file"});
  expect_error([&] { load_safetensors(temp_dir()); }, {"not a regular file (a directory)"});
  EXPECT_EQ(load_safetensors(write_bytes("good.safetensors", safetensors_bytes(8))).tensors.size(),
            1u);
  const std::string longer = write_bytes("long.safetensors", safetensors_bytes(4096));
  expect_error([&] { load_safetensors(longer); },
               {longer, "4096 data bytes", "end at byte 8", "trailing garbage"});
  const std::string shorter = write_bytes("short.safetensors", safetensors_bytes(4));
  expect_error([&] { load_safetensors(shorter); }, {shorter, "4 data bytes", "truncated"});
  // A header length over the limit is refused from the first 8 bytes of a (sparse) 200 MB file.
  std::string huge(8, '\0');
  const uint64_t length = kSafetensorsMaxHeaderBytes + 8;
  for (int byte = 0; byte < 8; ++byte) huge[byte] = static_cast<char>(length >> (8 * byte));
  const std::string huge_path = write_bytes("huge.safetensors", huge);
  std::filesystem::resize_file(huge_path, 2 * kSafetensorsMaxHeaderBytes);
  expect_error([&] { load_safetensors(huge_path); }, {huge_path, "exceeds the 100000000-byte"});
}

}  // namespace
}  // namespace ft
