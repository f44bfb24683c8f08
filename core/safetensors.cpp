// Encoding and decoding of safetensors bytes in memory, and saving; reading a file from disk with
// bounds (load_safetensors) lives in core/safetensors_file.cpp, and parsing the header both use in
// core/safetensors_header.cpp.
#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/math/bf16_math.h"
#include "core/safetensors_internal.h"
#include "core/tensor.h"

namespace ft {
namespace {

// The data section is copied byte for byte into floats and bf16 bit patterns, which is only right
// on little-endian hosts.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

using safetensors_internal::Json;
using safetensors_internal::json_error_text;
using safetensors_internal::kMetadataKey;
using OrderedJson = nlohmann::ordered_json;

// Bytes per element in the file.
uint64_t element_bytes(DType dtype) {
  return dtype_size(dtype);
}

// The format's name of a dtype, as the reference implementation writes it.
const char* format_dtype(DType dtype) {
  return dtype == DType::kBF16 ? "BF16" : "F32";
}

// A bf16-exact value (one read from a BF16 tensor) keeps its bits, NaN payloads included, so a file
// read and saved again is the same file; any other value rounds to nearest, ties to even.
bf16_bits bf16_for_file(float value) {
  const uint32_t bits = float_bits(value);
  return (bits & 0xFFFFu) == 0 ? static_cast<bf16_bits>(bits >> 16) : float_to_bf16(value);
}

// Appends a view's `numel` elements in its file dtype to `sink` (std::string or AtomicFileWriter);
// BF16 goes through a small buffer so a large tensor is never narrowed whole in memory.
template <typename Sink>
void append_data(Sink& sink, const SafetensorsView& view, uint64_t numel) {
  if (view.dtype == DType::kF32) {
    sink.append(reinterpret_cast<const char*>(view.data), numel * sizeof(float));
    return;
  }
  constexpr uint64_t kChunk = 16384;
  bf16_bits chunk[kChunk];
  for (uint64_t first = 0; first < numel; first += kChunk) {
    const uint64_t count = std::min(kChunk, numel - first);
    for (uint64_t i = 0; i < count; ++i) chunk[i] = bf16_for_file(view.data[first + i]);
    sink.append(reinterpret_cast<const char*>(chunk), count * sizeof(bf16_bits));
  }
}
// Element count of `shape`, or false when a dim is negative or the count overflows `limit`.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t limit, uint64_t* numel) {
  uint64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return false;
    if (dim == 0) count = 0;
  }
  if (count == 0) {
    *numel = 0;
    return true;
  }
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count) || count > limit)
      return false;
  }
  *numel = count;
  return true;
}

struct Layout {
  std::string header;                          // 8-byte length, then the space-padded JSON
  std::vector<const SafetensorsView*> sorted;  // data order == header order (by name)
  std::vector<uint64_t> numels;                // parallel to `sorted`
};

// Checks `views` and builds the header exactly as the reference writer does for F32 and BF16
// tensors.
Layout plan_layout(const std::map<std::string, std::string>& metadata,
                   const std::vector<SafetensorsView>& views, const std::string& origin) {
  Layout layout;
  for (const SafetensorsView& view : views) layout.sorted.push_back(&view);
  std::sort(layout.sorted.begin(), layout.sorted.end(),
            [](const SafetensorsView* a, const SafetensorsView* b) { return a->name < b->name; });

  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < layout.sorted.size(); ++i) {
    const SafetensorsView& view = *layout.sorted[i];
    if (view.name == kMetadataKey)
      FT_FAIL(origin, ": tensor name \"", kMetadataKey, "\" is reserved by the safetensors format");
    if (i > 0 && layout.sorted[i - 1]->name == view.name)
      FT_FAIL(origin, ": tensor name '", view.name, "' appears twice");
    if (view.dtype != DType::kF32 && view.dtype != DType::kBF16)
      FT_FAIL(origin, ": tensor '", view.name, "' has dtype ", static_cast<int>(view.dtype),
              "; only F32 and BF16 are written");
    // The limit keeps numel * element bytes within uint64 for either dtype.
    uint64_t numel = 0;
    if (!checked_numel(view.shape, std::numeric_limits<uint64_t>::max() / sizeof(float), &numel))
      FT_FAIL(origin, ": tensor '", view.name, "' has invalid shape ", shape_str(view.shape),
              " (negative dim or too many elements)");
    if (numel > 0 && view.data == nullptr)
      FT_FAIL(origin, ": tensor '", view.name, "' has shape ", shape_str(view.shape),
              " but no data");
    const uint64_t bytes = numel * element_bytes(view.dtype);
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = format_dtype(view.dtype);
    entry["shape"] = view.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    header[view.name] = std::move(entry);
    layout.numels.push_back(numel);
    offset += bytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    FT_FAIL(origin, ": cannot encode safetensors header (names and metadata must be UTF-8): ",
            json_error_text(e));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kSafetensorsMaxHeaderBytes)
    FT_FAIL(origin, ": safetensors header would be ", text.size(), " bytes, over the ",
            kSafetensorsMaxHeaderBytes, "-byte limit readers accept");
  uint64_t length = text.size();
  layout.header.reserve(8 + text.size());
  for (int byte = 0; byte < 8; ++byte)
    layout.header.push_back(static_cast<char>(length >> (8 * byte)));
  layout.header += text;
  return layout;
}

std::vector<SafetensorsView> views_of(const SafetensorsFile& file, const std::string& origin) {
  std::vector<SafetensorsView> views;
  for (const auto& [name, entry] : file.tensors) {
    uint64_t numel = 0;
    if (!checked_numel(entry.shape, std::numeric_limits<uint64_t>::max() / sizeof(float), &numel))
      FT_FAIL(origin, ": tensor '", name, "' has invalid shape ", shape_str(entry.shape),
              " (negative dim or too many elements)");
    if (numel != entry.data.size())
      FT_FAIL(origin, ": tensor '", name, "' has ", entry.data.size(), " floats but shape ",
              shape_str(entry.shape), " needs ", numel);
    views.push_back({name, entry.shape, entry.data.data(), entry.dtype});
  }
  return views;
}

using safetensors_internal::header_length;
using safetensors_internal::parse_header;
using safetensors_internal::to_count;

struct Span {
  uint64_t begin, end;
  const std::string* name;
  SafetensorsEntry* entry;  // its data is read once every span is known to tile the section
};

}  // namespace

std::string encode_safetensors(const SafetensorsFile& file) {
  std::vector<SafetensorsView> views = views_of(file, "encode_safetensors");
  Layout layout = plan_layout(file.metadata, views, "encode_safetensors");
  std::string bytes = std::move(layout.header);
  for (size_t i = 0; i < layout.sorted.size(); ++i)
    append_data(bytes, *layout.sorted[i], layout.numels[i]);
  return bytes;
}

void save_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                      const std::vector<SafetensorsView>& views) {
  Layout layout = plan_layout(metadata, views, path);
  AtomicFileWriter writer(path);
  writer.append(layout.header.data(), layout.header.size());
  for (size_t i = 0; i < layout.sorted.size(); ++i)
    append_data(writer, *layout.sorted[i], layout.numels[i]);
  writer.commit();
}

void save_safetensors(const std::string& path, const SafetensorsFile& file) {
  save_safetensors(path, file.metadata, views_of(file, path));
}

SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& origin) {
  if (bytes.size() < 8)
    FT_FAIL(origin, ": not a safetensors file: only ", bytes.size(),
            " bytes, less than the 8-byte header length (truncated?)");
  const uint64_t header_bytes = header_length(bytes.data(), bytes.size() - 8, origin);
  Json header = parse_header(std::string_view(bytes.data() + 8, header_bytes), origin);
  const uint64_t data_begin = 8 + header_bytes;
  const uint64_t data_bytes = bytes.size() - data_begin;

  SafetensorsFile file;
  std::vector<Span> spans;
  for (auto item = header.begin(); item != header.end(); ++item) {
    const std::string& name = item.key();
    const Json& value = item.value();
    if (name == kMetadataKey) {
      if (!value.is_object())
        FT_FAIL(origin, ": \"", kMetadataKey, "\" must be an object of strings, got ",
                value.type_name());
      for (auto meta = value.begin(); meta != value.end(); ++meta) {
        if (!meta.value().is_string())
          FT_FAIL(origin, ": \"", kMetadataKey, "\" key '", meta.key(),
                  "' must have a string value, got ", meta.value().type_name());
        file.metadata[meta.key()] = meta.value().get<std::string>();
      }
      continue;
    }
    const std::string where = origin + ": tensor '" + name + "'";
    if (!value.is_object()) FT_FAIL(where, " must be a JSON object, got ", value.type_name());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!value.contains(field)) FT_FAIL(where, " has no \"", field, "\"");

    const Json& dtype_json = value.at("dtype");
    const std::string* dtype_text =
        dtype_json.is_string() ? &dtype_json.get_ref<const std::string&>() : nullptr;
    if (dtype_text == nullptr || (*dtype_text != "F32" && *dtype_text != "BF16"))
      FT_FAIL(where, " has dtype ", dtype_json.dump(), "; only F32 and BF16 are supported");
    const DType dtype = *dtype_text == "BF16" ? DType::kBF16 : DType::kF32;
    const uint64_t element = element_bytes(dtype);

    const Json& shape_json = value.at("shape");
    if (!shape_json.is_array())
      FT_FAIL(where, " has \"shape\" ", shape_json.dump(), ", not an array");
    SafetensorsEntry entry;
    entry.dtype = dtype;
    for (const Json& dim_json : shape_json) {
      int64_t dim = 0;
      if (!to_count(dim_json, &dim))
        FT_FAIL(where, " has shape ", shape_json.dump(), "; dims must be integers >= 0");
      entry.shape.push_back(dim);
    }
    uint64_t numel = 0;
    if (!checked_numel(entry.shape, data_bytes / element, &numel))
      FT_FAIL(where, " has shape ", shape_str(entry.shape), ", more elements than the ", data_bytes,
              "-byte data section holds (truncated or corrupt file)");

    const Json& offsets = value.at("data_offsets");
    int64_t begin = 0, end = 0;
    if (!offsets.is_array() || offsets.size() != 2 || !to_count(offsets[0], &begin) ||
        !to_count(offsets[1], &end) || begin > end)
      FT_FAIL(where, " has \"data_offsets\" ", offsets.dump(),
              "; expected [begin, end] with 0 <= begin <= end");
    if (static_cast<uint64_t>(end) > data_bytes)
      FT_FAIL(where, " has data_offsets ", offsets.dump(), " past the end of the ", data_bytes,
              "-byte data section (truncated or corrupt file)");
    if (static_cast<uint64_t>(end - begin) != numel * element)
      FT_FAIL(where, " has shape ", shape_str(entry.shape), " (", numel * element, " bytes as ",
              *dtype_text, ") but data_offsets ", offsets.dump(), " span ", end - begin, " bytes");
    auto inserted = file.tensors.emplace(name, std::move(entry));
    spans.push_back({static_cast<uint64_t>(begin), static_cast<uint64_t>(end),
                     &inserted.first->first, &inserted.first->second});
  }

  // The format requires the tensors to tile the data section exactly: no overlaps, no holes.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Span& span : spans) {
    if (span.begin < covered)
      FT_FAIL(origin, ": tensor '", *span.name, "' data_offsets [", span.begin, ", ", span.end,
              "] overlap tensor '", *previous, "' (which ends at ", covered, ")");
    if (span.begin > covered)
      FT_FAIL(origin, ": data section bytes [", covered, ", ", span.begin,
              ") belong to no tensor (hole before tensor '", *span.name, "')");
    covered = span.end;
    previous = span.name;
  }
  if (covered != data_bytes)
    FT_FAIL(origin, ": data section has ", data_bytes, " bytes but tensors cover only the first ",
            covered, " (trailing garbage or corrupt offsets)");

  // Only now, with no two tensors sharing a byte, is the data read: many entries naming the same
  // bytes would otherwise each allocate a copy before the overlap is found.
  for (const Span& span : spans) {
    SafetensorsEntry& entry = *span.entry;
    const uint64_t numel = (span.end - span.begin) / element_bytes(entry.dtype);
    entry.data.resize(numel);
    const char* source = bytes.data() + data_begin + span.begin;
    if (entry.dtype == DType::kF32 && numel > 0)
      std::memcpy(entry.data.data(), source, span.end - span.begin);
    // bf16 is the top half of an fp32, so widening is exact.
    for (uint64_t i = 0; entry.dtype == DType::kBF16 && i < numel; ++i) {
      bf16_bits bits;
      std::memcpy(&bits, source + i * sizeof(bits), sizeof(bits));
      entry.data[i] = bf16_to_float(bits);
    }
  }
  return file;
}

}  // namespace ft
