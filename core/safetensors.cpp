// Encoding and decoding of safetensors bytes in memory, and saving; reading a file from disk with
// bounds (load_safetensors) lives in core/safetensors_file.cpp.
#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/safetensors_internal.h"
#include "core/tensor.h"

namespace ft {
namespace {

// The data section is copied byte for byte into floats, which is only right on little-endian hosts.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

using safetensors_internal::Json;
using safetensors_internal::kMetadataKey;
using OrderedJson = nlohmann::ordered_json;

constexpr uint64_t kFloatBytes = sizeof(float);
// A header nests at most 3 deep ({ { [ ); the slack admits unknown extra fields from other
// writers, while stopping "[[[[..." from making the parser allocate per level.
constexpr size_t kMaxHeaderNesting = 32;
// Longer arrays are dropped while parsing, so a corrupt shape cannot balloon into a huge DOM.
constexpr size_t kMaxArrayItems = 64;

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

// The exception's own message without its "[json.exception.type_error.316] " prefix.
std::string json_error_text(const nlohmann::json::exception& e) {
  const std::string text = e.what();
  const size_t prefix_end = text.rfind("[json.exception.", 0) == 0 ? text.find("] ") : text.npos;
  return prefix_end == text.npos ? text : text.substr(prefix_end + 2);
}

struct Layout {
  std::string header;                          // 8-byte length, then the space-padded JSON
  std::vector<const SafetensorsView*> sorted;  // data order == header order (by name)
  std::vector<uint64_t> byte_sizes;            // parallel to `sorted`
};

// Checks `views` and builds the header exactly as the reference writer does for F32 tensors.
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
    uint64_t numel = 0;
    if (!checked_numel(view.shape, std::numeric_limits<uint64_t>::max() / kFloatBytes, &numel))
      FT_FAIL(origin, ": tensor '", view.name, "' has invalid shape ", shape_str(view.shape),
              " (negative dim or too many elements)");
    if (numel > 0 && view.data == nullptr)
      FT_FAIL(origin, ": tensor '", view.name, "' has shape ", shape_str(view.shape),
              " but no data");
    uint64_t bytes = numel * kFloatBytes;
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = "F32";
    entry["shape"] = view.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    header[view.name] = std::move(entry);
    layout.byte_sizes.push_back(bytes);
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
    if (!checked_numel(entry.shape, std::numeric_limits<uint64_t>::max() / kFloatBytes, &numel))
      FT_FAIL(origin, ": tensor '", name, "' has invalid shape ", shape_str(entry.shape),
              " (negative dim or too many elements)");
    if (numel != entry.data.size())
      FT_FAIL(origin, ": tensor '", name, "' has ", entry.data.size(), " floats but shape ",
              shape_str(entry.shape), " needs ", numel);
    views.push_back({name, entry.shape, entry.data.data()});
  }
  return views;
}

// Deepest nesting of [ and { outside JSON strings.
size_t max_nesting(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

namespace safetensors_internal {

// Parses the header JSON, reporting duplicate keys (which nlohmann would silently collapse) and
// arrays longer than kMaxArrayItems.
Json parse_header(std::string_view text, const std::string& origin) {
  if (max_nesting(text) > kMaxHeaderNesting)
    FT_FAIL(origin, ": safetensors header nests deeper than ", kMaxHeaderNesting, " levels");
  std::vector<std::set<std::string>> keys_by_depth(kMaxHeaderNesting + 1);
  std::vector<size_t> items_by_depth(kMaxHeaderNesting + 1, 0);
  std::vector<bool> array_at_depth(kMaxHeaderNesting + 1, false);
  std::string duplicate_key;
  bool array_too_long = false;
  auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) -> bool {
    // Object/array start events carry the container's depth; keys and values carry depth + 1.
    size_t level = static_cast<size_t>(depth);
    if (level >= keys_by_depth.size()) return true;  // unreachable: max_nesting bounds the depth
    if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) {
      keys_by_depth[level].clear();
      items_by_depth[level] = 0;
      array_at_depth[level] = event == Json::parse_event_t::array_start;
    } else if (event == Json::parse_event_t::key && level > 0) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys_by_depth[level - 1].insert(key).second && duplicate_key.empty())
        duplicate_key = key;
    }
    bool starts_item = event == Json::parse_event_t::value ||
                       event == Json::parse_event_t::object_start ||
                       event == Json::parse_event_t::array_start;
    bool array_item = starts_item && level > 0 && array_at_depth[level - 1];
    if (array_item && ++items_by_depth[level - 1] > kMaxArrayItems) {
      array_too_long = true;
      return false;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.end(), on_event);
  } catch (const nlohmann::json::parse_error& e) {
    // Only the position: nlohmann's text quotes the bytes it read, which may be binary garbage.
    // e.byte is the 1-based position of the offending byte, one past the end at end of input.
    if (e.byte > text.size())
      FT_FAIL(origin, ": safetensors header is not valid JSON: its ", text.size(),
              " bytes end before a complete JSON value (truncated or corrupt file)");
    FT_FAIL(origin, ": safetensors header is not valid JSON: unexpected byte at file offset ",
            8 + e.byte - 1, " (corrupt file or not safetensors)");
  } catch (const nlohmann::json::exception& e) {
    FT_FAIL(origin, ": safetensors header is not valid JSON: ", json_error_text(e));
  }
  if (!duplicate_key.empty())
    FT_FAIL(origin, ": safetensors header has key '", duplicate_key, "' twice");
  if (array_too_long)
    FT_FAIL(origin, ": safetensors header has an array longer than ", kMaxArrayItems,
            " elements (shapes may have at most ", kMaxArrayItems, " dims)");
  if (!header.is_object())
    FT_FAIL(origin, ": safetensors header is not a JSON object but ", header.type_name());
  return header;
}

// A JSON integer >= 0 that fits int64, or false.
bool to_count(const Json& value, int64_t* out) {
  if (value.is_number_unsigned()) {
    uint64_t v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (!value.is_number_integer()) return false;
  *out = value.get<int64_t>();
  return *out >= 0;
}

// The little-endian header length in the first 8 bytes of `prefix`, checked against the limit
// and against the `following` bytes the file holds after it.
uint64_t header_length(const char* prefix, uint64_t following, const std::string& origin) {
  uint64_t header_bytes = 0;
  for (int byte = 0; byte < 8; ++byte)
    header_bytes |= static_cast<uint64_t>(static_cast<unsigned char>(prefix[byte])) << (8 * byte);
  if (header_bytes == 0)
    FT_FAIL(origin,
            ": safetensors header length is 0; even a file with no tensors has a JSON "
            "header (\"{}\") (corrupt file or not safetensors)");
  if (header_bytes > kSafetensorsMaxHeaderBytes)
    FT_FAIL(origin, ": safetensors header length ", header_bytes, " exceeds the ",
            kSafetensorsMaxHeaderBytes, "-byte limit (corrupt file or not safetensors)");
  if (header_bytes > following)
    FT_FAIL(origin, ": safetensors header length ", header_bytes, " exceeds the ", following,
            " bytes that follow it (truncated or corrupt file)");
  return header_bytes;
}

}  // namespace safetensors_internal

namespace {

using safetensors_internal::header_length;
using safetensors_internal::parse_header;
using safetensors_internal::to_count;

struct Span {
  uint64_t begin, end;
  const std::string* name;
};

}  // namespace

std::string encode_safetensors(const SafetensorsFile& file) {
  std::vector<SafetensorsView> views = views_of(file, "encode_safetensors");
  Layout layout = plan_layout(file.metadata, views, "encode_safetensors");
  std::string bytes = std::move(layout.header);
  for (size_t i = 0; i < layout.sorted.size(); ++i)
    bytes.append(reinterpret_cast<const char*>(layout.sorted[i]->data), layout.byte_sizes[i]);
  return bytes;
}

void save_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                      const std::vector<SafetensorsView>& views) {
  Layout layout = plan_layout(metadata, views, path);
  AtomicFileWriter writer(path);
  writer.append(layout.header.data(), layout.header.size());
  for (size_t i = 0; i < layout.sorted.size(); ++i)
    writer.append(layout.sorted[i]->data, layout.byte_sizes[i]);
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

    const Json& dtype = value.at("dtype");
    if (!dtype.is_string() || dtype.get_ref<const std::string&>() != "F32")
      FT_FAIL(where, " has dtype ", dtype.dump(), "; only F32 is supported");

    const Json& shape_json = value.at("shape");
    if (!shape_json.is_array())
      FT_FAIL(where, " has \"shape\" ", shape_json.dump(), ", not an array");
    SafetensorsEntry entry;
    for (const Json& dim_json : shape_json) {
      int64_t dim = 0;
      if (!to_count(dim_json, &dim))
        FT_FAIL(where, " has shape ", shape_json.dump(), "; dims must be integers >= 0");
      entry.shape.push_back(dim);
    }
    uint64_t numel = 0;
    if (!checked_numel(entry.shape, data_bytes / kFloatBytes, &numel))
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
    if (static_cast<uint64_t>(end - begin) != numel * kFloatBytes)
      FT_FAIL(where, " has shape ", shape_str(entry.shape), " (", numel * kFloatBytes,
              " bytes as F32) but data_offsets ", offsets.dump(), " span ", end - begin, " bytes");
    entry.data.resize(numel);
    if (numel > 0) std::memcpy(entry.data.data(), bytes.data() + data_begin + begin, end - begin);
    auto inserted = file.tensors.emplace(name, std::move(entry));
    spans.push_back(
        {static_cast<uint64_t>(begin), static_cast<uint64_t>(end), &inserted.first->first});
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
  return file;
}

}  // namespace ft
