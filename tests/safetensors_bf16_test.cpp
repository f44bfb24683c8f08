// Tests for BF16 tensors in core/safetensors: the bytes the reference writes for BF16, exact
// widening on read, round to nearest (ties to even) on write, bit-exact round trips (NaN payloads
// included) in memory, on disk and from views, and BF16 headers whose sizes do not add up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/math/bf16_math.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "tests/safetensors_test_util.h"

namespace ft {
namespace {

using safetensors_test::error_of;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/safetensors_bf16_" + std::to_string(getpid()) + "_" + name;
}

// A file of `header` (padded with spaces to a multiple of 8, as writers pad) and `data`.
std::string raw_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  for (int byte = 0; byte < 8; ++byte)
    out.push_back(static_cast<char>(header.size() >> (8 * byte)));
  return out + header + data;
}

std::string bf16_bytes(const std::vector<bf16_bits>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 2);
}

// The data section of encoded bytes (everything after the header).
std::string data_of(const std::string& bytes) {
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return bytes.substr(8 + length);
}

std::vector<uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float value : values) bits.push_back(float_bits(value));
  return bits;
}

// Hand-built from the format: "BF16", 2 bytes per element, tensors by name.
TEST(SafetensorsBf16, WritesTheReferenceBytes) {
  SafetensorsFile file;
  file.tensors["w"] = {{2}, {1.0f, -2.0f}, DType::kBF16};
  file.tensors["a"] = {{1}, {0.5f}};
  const std::string json =
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"w\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]}}";
  const std::string data = std::string("\x00\x00\x00\x3f", 4) + bf16_bytes({0x3F80, 0xC000});
  EXPECT_EQ(encode_safetensors(file), raw_file(json, data));
}

TEST(SafetensorsBf16, ReadingWidensExactly) {
  const std::vector<bf16_bits> stored = {0x3F80, 0xC0A0, 0x0001, 0x7F7F, 0xFF80, 0x7F81, 0x8000};
  const std::string bytes = raw_file(
      "{\"t\":{\"dtype\":\"BF16\",\"shape\":[7],\"data_offsets\":[0,14]}}", bf16_bytes(stored));
  const SafetensorsFile file = decode_safetensors(bytes, "widen");
  const SafetensorsEntry& entry = file.tensors.at("t");
  EXPECT_EQ(entry.dtype, DType::kBF16);
  ASSERT_EQ(entry.data.size(), stored.size());
  for (size_t i = 0; i < stored.size(); ++i)
    EXPECT_EQ(float_bits(entry.data[i]), static_cast<uint32_t>(stored[i]) << 16) << "element " << i;
  EXPECT_EQ(entry.data[1], -5.0f);
  EXPECT_TRUE(std::isnan(entry.data[5])) << "a signalling NaN stays a NaN";
}

// 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to the even 1; 1 + 3 * 2^-8 lies halfway
// between 1 + 2^-7 and 1 + 2^-6 and goes to the even 1 + 2^-6.
TEST(SafetensorsBf16, WritingRoundsToNearestTiesToEven) {
  const float max_float = std::numeric_limits<float>::max();
  const std::vector<float> values = {
      1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f,
      -0.1f,          max_float,          float_from_bits(0x7FC00001)};
  const std::vector<bf16_bits> expected = {0x3F80, 0x3F82, 0x3F81, 0xBDCD, 0x7F80, 0x7FC0};
  SafetensorsFile file;
  file.tensors["t"] = {{6}, values, DType::kBF16};
  const std::string bytes = encode_safetensors(file);
  EXPECT_EQ(data_of(bytes), bf16_bytes(expected));

  // Any value reads back as round_to_bf16 of what was written.
  Rng rng(7);
  SafetensorsFile random;
  std::vector<float>& data = random.tensors["r"].data;
  for (int i = 0; i < 4096; ++i) data.push_back(rng.normal() * std::ldexp(1.0f, i % 64 - 32));
  random.tensors["r"].shape = {4096};
  random.tensors["r"].dtype = DType::kBF16;
  const SafetensorsFile read = decode_safetensors(encode_safetensors(random), "random");
  std::vector<float> rounded;
  for (float value : data) rounded.push_back(round_to_bf16(value));
  EXPECT_EQ(bits_of(read.tensors.at("r").data), bits_of(rounded));
}

// What a BF16 tensor reads as is saved with the same bits, so reading and saving again gives the
// same file: in memory, through save_safetensors and from views of caller memory.
TEST(SafetensorsBf16, RoundTripsAreBitExact) {
  SafetensorsFile file;
  file.metadata["dtype"] = "bf16";
  file.tensors["b"] = {{2, 4},
                       {1.0f, -0.0f, INFINITY, -INFINITY, float_from_bits(0x7F810000),
                        float_from_bits(0x00010000), round_to_bf16(0.3f), 65280.0f},
                       DType::kBF16};
  file.tensors["empty"] = {{0, 3}, {}, DType::kBF16};
  file.tensors["f"] = {{2}, {0.1f, 1e-45f}};
  const std::string bytes = encode_safetensors(file);
  EXPECT_EQ(data_of(bytes).size(), 8u * 2 + 2 * 4);
  const SafetensorsFile read = decode_safetensors(bytes, "round trip");
  EXPECT_EQ(read.metadata, file.metadata);
  for (const auto& [name, entry] : file.tensors) {
    EXPECT_EQ(read.tensors.at(name).dtype, entry.dtype) << name;
    EXPECT_EQ(read.tensors.at(name).shape, entry.shape) << name;
    EXPECT_EQ(bits_of(read.tensors.at(name).data), bits_of(entry.data)) << name;
  }
  EXPECT_EQ(encode_safetensors(read), bytes);

  const std::string path = temp_path("round_trip.safetensors");
  save_safetensors(path, read);
  const SafetensorsFile loaded = load_safetensors(path);
  EXPECT_EQ(encode_safetensors(loaded), bytes);
  EXPECT_EQ(loaded.tensors.at("b").dtype, DType::kBF16);

  // Views: a large tensor goes through the writer's chunks; fp32 values round as they are written.
  std::vector<float> big(40000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 1.0f + static_cast<float>(i) * 1e-5f;
  const std::string view_path = temp_path("views.safetensors");
  save_safetensors(
      view_path, {{"dtype", "bf16"}},
      {{"big", {200, 200}, big.data(), DType::kBF16}, {"f", {2}, file.tensors["f"].data.data()}});
  const SafetensorsFile viewed = load_safetensors(view_path);
  EXPECT_EQ(data_of(read_file(view_path)).size(), big.size() * 2 + 2 * 4);
  std::vector<float> rounded;
  for (float value : big) rounded.push_back(round_to_bf16(value));
  EXPECT_EQ(bits_of(viewed.tensors.at("big").data), bits_of(rounded));
  EXPECT_EQ(viewed.tensors.at("f").data, file.tensors["f"].data);
}

// Every size check counts 2 bytes per BF16 element, and says so; each is checked in memory and
// on disk (where the sizes are checked before the data is read).
TEST(SafetensorsBf16, MalformedBf16HeadersAreRefused) {
  struct Case {
    std::string header;
    size_t data_bytes;
    std::vector<std::string> expected;
  };
  const auto one = [](const std::string& entry) { return "{\"t\":" + entry + "}"; };
  const std::vector<Case> cases = {
      // An F32-sized span for a BF16 shape, and a BF16-sized one for an F32 shape.
      {one("{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,8]}"),
       8,
       {"tensor 't' has shape [2] (4 bytes as BF16) but data_offsets [0,8] span 8 bytes"}},
      {one("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}"),
       8,
       {"(8 bytes as F32) but data_offsets [0,4] span 4 bytes"}},
      // An odd span, and more elements than the section holds at 2 bytes each.
      {one("{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,3]}"),
       4,
       {"(4 bytes as BF16) but data_offsets [0,3] span 3 bytes"}},
      {one("{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,5]}"),
       5,
       {"has shape [3], more elements than the 5-byte data section holds"}},
      {one("{\"dtype\":\"BF16\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}"),
       8,
       {"more elements than the 8-byte data section holds"}},
      {one("{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}"),
       6,
       {"tensors cover only the first 4", "trailing garbage"}},
      {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
       "\"b\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[2,4]}}",
       4,
       {"overlap"}},
      {one("{\"dtype\":\"bf16\",\"shape\":[2],\"data_offsets\":[0,4]}"),
       4,
       {"dtype \"bf16\"; only F32 and BF16 are supported"}},
      {one("{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}"),
       4,
       {"dtype \"F16\"; only F32 and BF16 are supported"}},
  };
  for (const Case& c : cases) {
    const std::string bytes = raw_file(c.header, std::string(c.data_bytes, '\0'));
    const std::string memory = error_of([&] { decode_safetensors(bytes, "case"); });
    const std::string path = temp_path("malformed.safetensors");
    write_file_atomic(path, bytes);
    const std::string disk = error_of([&] { load_safetensors(path); });
    EXPECT_NE(disk.find(path), std::string::npos) << disk;
    for (const std::string& part : c.expected) {
      EXPECT_NE(memory.find(part), std::string::npos) << c.header << ": " << memory;
      // On disk the size check before reading may word a wrong total first.
      const bool size_refusal = disk.find("data bytes after its header") != std::string::npos;
      EXPECT_TRUE(size_refusal || disk.find(part) != std::string::npos) << c.header << ": " << disk;
    }
  }
}

// A BF16 file cut short is refused by size, naming the file, before its data is read.
TEST(SafetensorsBf16, TruncatedBf16FileNamesThePath) {
  SafetensorsFile file;
  file.tensors["t"] = {{3}, {1.0f, 2.0f, 3.0f}, DType::kBF16};
  const std::string bytes = encode_safetensors(file);
  const std::string path = temp_path("truncated.safetensors");
  write_file_atomic(path, bytes.substr(0, bytes.size() - 1));
  const std::string message = error_of([&] { load_safetensors(path); });
  EXPECT_NE(message.find(path + ": file has 5 data bytes after its header, but its tensors end at "
                                "byte 6 (truncated"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace ft
