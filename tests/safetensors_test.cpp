// Tests for core/safetensors and core/atomic_file: golden bytes from the reference implementation,
// bit-exact round trips, every class of corrupt input, and atomic replacement on disk.
#include "core/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
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
#include <limits>
#include <thread>

#include "core/atomic_file.h"
#include "core/check.h"
#include "tests/fifo_test_util.h"
#include "tests/safetensors_test_util.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

using safetensors_test::error_of;

void expect_error(const std::function<void()>& action, const std::vector<std::string>& parts) {
  std::string message = error_of(action);
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
}

std::string bytes_of(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

// A raw file: little-endian length of `header`, `header` itself, then `data_bytes` zero bytes.
std::string raw_file(const std::string& header, size_t data_bytes) {
  std::string out;
  for (int byte = 0; byte < 8; ++byte)
    out.push_back(static_cast<char>(header.size() >> (8 * byte)));
  return out + header + std::string(data_bytes, '\0');
}

std::string one_tensor_header(const std::string& entry) {
  return "{\"t\":" + entry + "}";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

SafetensorsFile sample_file() {
  SafetensorsFile file;
  file.metadata = {{"format", "pt"}, {"note", "caf\xc3\xa9 \"quoted\""}};
  file.tensors["w.weight"] = {{3, 4}, {}};
  for (int i = 0; i < 12; ++i) file.tensors["w.weight"].data.push_back(0.25f * i - 1.0f);
  file.tensors["scalar"] = {{}, {std::numeric_limits<float>::infinity()}};
  file.tensors["empty"] = {{0}, {}};
  file.tensors["empty2d"] = {{2, 0, 3}, {}};
  file.tensors["special"] = {{5},
                             {-0.0f, std::numeric_limits<float>::denorm_min(),
                              float_from_bits(0x7fc01234u) /* NaN with payload */,
                              -std::numeric_limits<float>::infinity(), 3.0e38f}};
  return file;
}

void expect_same_file(const SafetensorsFile& expected, const SafetensorsFile& actual) {
  EXPECT_EQ(expected.metadata, actual.metadata);
  ASSERT_EQ(expected.tensors.size(), actual.tensors.size());
  for (const auto& [name, entry] : expected.tensors) {
    auto found = actual.tensors.find(name);
    ASSERT_NE(found, actual.tensors.end()) << name;
    EXPECT_EQ(entry.shape, found->second.shape) << name;
    EXPECT_TRUE(same_bits(entry.data, found->second.data)) << name;
  }
}

class SafetensorsDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "safetensors_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> names_in(const std::string& directory) const {
    std::vector<std::string> names;
    for (const auto& item : fs::directory_iterator(directory))
      names.push_back(item.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  void write_plain(const std::string& file, const std::string& bytes) const {
    std::ofstream(file, std::ios::binary) << bytes;
  }

  std::string dir_;
};

// Expected bytes copied from the reference implementation's own tests (safetensors/src/tensor.rs).
TEST(SafetensorsGolden, MatchesReferenceSerializer) {
  SafetensorsFile file;
  file.tensors["attn.0"] = {{1, 2, 3}, {0, 1, 2, 3, 4, 5}};
  std::string expected =
      bytes_of({64, 0,  0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,
                34, 58, 123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,
                44, 34, 115, 104, 97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,
                44, 34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115, 34,  58,
                91, 48, 44,  50,  52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
                0,  0,  0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64});
  EXPECT_EQ(encode_safetensors(file), expected);
  expect_same_file(file, decode_safetensors(expected, "golden"));

  EXPECT_EQ(encode_safetensors(SafetensorsFile{}),
            bytes_of({8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32}));
  SafetensorsFile only_metadata;
  only_metadata.metadata["framework"] = "pt";
  EXPECT_EQ(encode_safetensors(only_metadata),
            bytes_of({40,  0,   0,   0,  0,  0,  0,   0,   123, 34,  95,  95,  109, 101, 116, 97,
                      100, 97,  116, 97, 95, 95, 34,  58,  123, 34,  102, 114, 97,  109, 101, 119,
                      111, 114, 107, 34, 58, 34, 112, 116, 34,  125, 125, 32,  32,  32,  32,  32}));
}

// Hand-built: metadata first, tensors by name, a scalar, and 4 spaces of padding (132 -> 136).
TEST(SafetensorsGolden, MetadataScalarAndPadding) {
  SafetensorsFile file;
  file.metadata["k"] = "v";
  file.tensors["b"] = {{}, {-2.0f}};
  file.tensors["a"] = {{2}, {1.0f, 0.5f}};
  std::string json =
      "{\"__metadata__\":{\"k\":\"v\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]}}";
  ASSERT_EQ(json.size(), 132u);
  std::string expected = bytes_of({136, 0, 0, 0, 0, 0, 0, 0}) + json + "    " +
                         bytes_of({0, 0, 0x80, 0x3f, 0, 0, 0, 0x3f, 0, 0, 0, 0xc0});
  EXPECT_EQ(encode_safetensors(file), expected);
  expect_same_file(file, decode_safetensors(expected, "golden"));
}

TEST(SafetensorsCodec, RoundTripIsBitExact) {
  SafetensorsFile file = sample_file();
  std::string bytes = encode_safetensors(file);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]) % 8, 0) << "header must be padded to 8 bytes";
  EXPECT_EQ(bytes[8], '{');
  expect_same_file(file, decode_safetensors(bytes, "memory"));
}

TEST(SafetensorsCodec, AcceptsUnknownFieldsAndEmptyTensorsAtBoundaries) {
  std::string header =
      "{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
      "\"a\":{\"extra\":{\"x\":[1]},\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}  ";
  SafetensorsFile file = decode_safetensors(raw_file(header, 8), "lenient");
  EXPECT_EQ(file.tensors.size(), 3u);
  EXPECT_EQ(file.tensors.at("z").shape, std::vector<int64_t>{0});
  EXPECT_EQ(file.tensors.at("b").data, std::vector<float>{0.0f});
}

TEST(SafetensorsCodec, RejectsBadLengthField) {
  expect_error([] { decode_safetensors(std::string(5, '\0'), "short.st"); },
               {"short.st", "8-byte", "truncated"});
  expect_error([] { decode_safetensors(std::string(8, '\xff') + "{}", "huge.st"); },
               {"huge.st", "100000000-byte limit"});
  expect_error(
      [] {
        decode_safetensors(bytes_of({200, 0, 0, 0, 0, 0, 0, 0}) + "{}", "long.st");
      },
      {"long.st", "header length 200", "2 bytes"});
}

TEST(SafetensorsCodec, ZeroHeaderLengthAndBadJsonGiveCleanMessages) {
  expect_error([] { decode_safetensors(std::string(8, '\0'), "zero.st"); },
               {"zero.st: safetensors header length is 0"});
  // The position, not nlohmann's own text (which quotes the raw bytes it read).
  const std::string bad = error_of([] { decode_safetensors(raw_file("{\"a\":xx}", 0), "bad.st"); });
  EXPECT_EQ(bad,
            "bad.st: safetensors header is not valid JSON: unexpected byte at file offset 13 "
            "(corrupt file or not safetensors)");
  const std::string cut = error_of([] { decode_safetensors(raw_file("{\"a\":[1,", 0), "cut.st"); });
  EXPECT_EQ(cut,
            "cut.st: safetensors header is not valid JSON: its 8 bytes end before a complete JSON "
            "value (truncated or corrupt file)");
}

TEST(SafetensorsCodec, RejectsMalformedHeaders) {
  struct Case {
    std::string header;
    size_t data_bytes;
    std::string expected;
  };
  std::string deep = "{\"__metadata__\":" + std::string(1000, '[') + std::string(1000, ']') + "}";
  std::string long_shape = "[1";
  for (int i = 0; i < 64; ++i) long_shape += ",1";
  long_shape += "]";
  std::vector<Case> cases = {
      {"{not json}", 0, "not valid JSON"},
      {"{\"t\":\"\xff\"}", 0, "not valid JSON"},
      {"[1, 2]", 0, "not a JSON object"},
      {deep, 0, "nests deeper"},
      {"{\"__metadata__\":[]}", 0, "must be an object of strings"},
      {"{\"__metadata__\":{\"k\":5}}", 0, "key 'k' must have a string value"},
      {"{\"a\":{},\"a\":{}}", 0, "key 'a' twice"},
      {one_tensor_header("[]"), 0, "tensor 't' must be a JSON object"},
      {one_tensor_header("{\"shape\":[],\"data_offsets\":[0,4]}"), 4, "has no \"dtype\""},
      {one_tensor_header("{\"dtype\":\"F32\",\"data_offsets\":[0,4]}"), 4, "has no \"shape\""},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[]}"), 4, "has no \"data_offsets\""},
      {one_tensor_header("{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}"), 4,
       "dtype \"F16\"; only F32 and BF16 are supported"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}"), 4,
       "dims must be integers >= 0"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,4]}"), 4,
       "dims must be integers >= 0"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[18446744073709551615],"
                         "\"data_offsets\":[0,4]}"),
       4, "dims must be integers >= 0"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":" + long_shape + ",\"data_offsets\":[0,4]}"),
       4, "longer than 64"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                         "\"data_offsets\":[0,4]}"),
       4, "more elements than the 4-byte data section"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}"), 8,
       "span 4 bytes"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}"), 4,
       "0 <= begin <= end"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}"), 8,
       "0 <= begin <= end"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}"), 4,
       "past the end of the 4-byte data section"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, "overlap tensor 'a'"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}"), 8,
       "bytes [0, 4) belong to no tensor"},
      {one_tensor_header("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"), 12,
       "tensors cover only the first 4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    expect_error([&] { decode_safetensors(raw_file(c.header, c.data_bytes), "bad.st"); },
                 {"bad.st: ", c.expected});
  }
}

TEST(SafetensorsCodec, RejectsInvalidTensorsOnEncode) {
  SafetensorsFile wrong_size;
  wrong_size.tensors["w"] = {{2, 3}, {1, 2, 3}};
  expect_error([&] { encode_safetensors(wrong_size); }, {"'w'", "3 floats", "needs 6"});
  SafetensorsFile negative;
  negative.tensors["w"] = {{-1}, {}};
  expect_error([&] { encode_safetensors(negative); }, {"'w'", "invalid shape [-1]"});
  SafetensorsFile reserved;
  reserved.tensors["__metadata__"] = {{}, {1}};
  expect_error([&] { encode_safetensors(reserved); }, {"reserved"});
  SafetensorsFile bad_utf8;
  bad_utf8.tensors["\xff"] = {{}, {1}};
  expect_error([&] { encode_safetensors(bad_utf8); }, {"UTF-8"});
}

TEST_F(SafetensorsDiskTest, SaveLoadRoundTripAndViewsWriteIdenticalBytes) {
  SafetensorsFile file = sample_file();
  save_safetensors(path("model.safetensors"), file);
  expect_same_file(file, load_safetensors(path("model.safetensors")));
  EXPECT_EQ(read_file(path("model.safetensors")), encode_safetensors(file));

  // Views given out of order still come out sorted, byte-identical to the owning path.
  std::vector<SafetensorsView> views;
  for (auto it = file.tensors.rbegin(); it != file.tensors.rend(); ++it)
    views.push_back({it->first, it->second.shape, it->second.data.data()});
  save_safetensors(path("views.safetensors"), file.metadata, views);
  EXPECT_EQ(read_file(path("views.safetensors")), encode_safetensors(file));
  EXPECT_EQ(names_in(dir_), (std::vector<std::string>{"model.safetensors", "views.safetensors"}));
}

TEST_F(SafetensorsDiskTest, ViewsRejectDuplicatesAndMissingData) {
  float value = 1.0f;
  std::vector<SafetensorsView> duplicate = {{"x", {}, &value}, {"x", {}, &value}};
  expect_error([&] { save_safetensors(path("d.st"), {}, duplicate); },
               {"d.st", "'x' appears twice"});
  std::vector<SafetensorsView> missing = {{"y", {2}, nullptr}, {"z", {0}, nullptr}};
  expect_error([&] { save_safetensors(path("m.st"), {}, missing); }, {"m.st", "'y'", "no data"});
  EXPECT_TRUE(names_in(dir_).empty());
}

TEST_F(SafetensorsDiskTest, TruncatedFilesNameThePath) {
  std::string bytes = encode_safetensors(sample_file());
  uint64_t header_bytes =
      static_cast<unsigned char>(bytes[0]) | static_cast<unsigned char>(bytes[1]) << 8;
  ASSERT_GT(bytes.size(), 8 + header_bytes + 8);
  std::vector<size_t> cuts = {0,
                              3,
                              7,
                              8,
                              20,
                              static_cast<size_t>(8 + header_bytes - 1),
                              static_cast<size_t>(8 + header_bytes + 5),
                              bytes.size() - 1};
  for (size_t cut : cuts) {
    SCOPED_TRACE(cut);
    std::string file = path("cut" + std::to_string(cut) + ".safetensors");
    write_plain(file, bytes.substr(0, cut));
    expect_error([&] { load_safetensors(file); }, {file + ": ", "truncated"});
  }
}

TEST_F(SafetensorsDiskTest, CorruptHeaderOnDiskNamesThePath) {
  std::string bytes = encode_safetensors(sample_file());
  bytes[8 + 1] = '#';  // the opening quote of "__metadata__"
  write_plain(path("corrupt.safetensors"), bytes);
  expect_error([&] { load_safetensors(path("corrupt.safetensors")); },
               {path("corrupt.safetensors"), "not valid JSON"});
  expect_error([&] { load_safetensors(path("absent.safetensors")); },
               {path("absent.safetensors"), "No such file"});
  write_plain(path("zero.safetensors"), std::string(8, '\0'));
  expect_error([&] { load_safetensors(path("zero.safetensors")); },
               {path("zero.safetensors") + ": safetensors header length is 0"});
}

TEST_F(SafetensorsDiskTest, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = path("fifo.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::string message = fifo_test::error_reading_fifo(fifo, [&] { load_safetensors(fifo); });
  EXPECT_NE(message.find(fifo + ": not a regular file (a pipe)"), std::string::npos) << message;
}

TEST_F(SafetensorsDiskTest, AtomicWriteReplacesAndLeavesNoTempFile) {
  std::string target = path("nested/deeper/out.bin");
  write_file_atomic(target, "first version, longer");
  EXPECT_EQ(read_file(target), "first version, longer");
  write_file_atomic(target, std::string("new\0data", 8));
  EXPECT_EQ(read_file(target), std::string("new\0data", 8));
  EXPECT_EQ(names_in(path("nested/deeper")), std::vector<std::string>{"out.bin"});
  write_file_atomic(target, "");
  EXPECT_EQ(read_file(target), "");
}

TEST_F(SafetensorsDiskTest, AbandonedWriterKeepsOldFile) {
  std::string target = path("keep.bin");
  write_file_atomic(target, "old");
  {
    AtomicFileWriter writer(target);
    writer.append("partial", 7);
    EXPECT_TRUE(fs::exists(writer.temp_path()));
  }
  EXPECT_EQ(read_file(target), "old");
  EXPECT_EQ(names_in(dir_), std::vector<std::string>{"keep.bin"});
}

TEST_F(SafetensorsDiskTest, UnwritableDestinationsThrowAndCleanUp) {
  write_plain(path("regular"), "x");
  std::string under_file = path("regular/sub/out.bin");
  expect_error([&] { write_file_atomic(under_file, "data"); }, {under_file, "Not a directory"});
  expect_error([&] { save_safetensors(path("regular/model.st"), sample_file()); },
               {path("regular/model.st")});

  // A directory in the way is refused before anything is written (resolve_output_target)...
  fs::create_directory(path("occupied"));
  expect_error([&] { write_file_atomic(path("occupied"), "data"); },
               {path("occupied"), "it exists and is a directory"});
  // ...and one that appears while the file is written makes the rename fail after the temp file
  // was fully written; the temp file is removed.
  {
    AtomicFileWriter writer(path("late"));
    writer.append("data", 4);
    fs::create_directory(path("late"));
    expect_error([&] { writer.commit(); }, {path("late"), "renaming"});
  }
  EXPECT_EQ(names_in(dir_), (std::vector<std::string>{"late", "occupied", "regular"}));
  expect_error([&] { write_file_atomic(path("trailing/"), "data"); }, {"not a file path"});
}

TEST_F(SafetensorsDiskTest, ReadFileErrorsNameThePath) {
  expect_error([&] { read_file(path("missing.bin")); }, {path("missing.bin"), "No such file"});
  expect_error([&] { read_file(dir_); }, {dir_, "directory"});
}

}  // namespace
}  // namespace ft
