// The safetensors header shared by both readers (decode_safetensors in core/safetensors.cpp and
// the bounded file reader in core/safetensors_file.cpp): its length field and its JSON, parsed
// with limits on nesting, array length and duplicate keys that nlohmann would collapse.
#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/safetensors.h"
#include "core/safetensors_internal.h"

namespace ft {
namespace {

using safetensors_internal::Json;

// A header nests at most 3 deep ({ { [ ); the slack admits unknown extra fields from other
// writers, while stopping "[[[[..." from making the parser allocate per level.
constexpr size_t kMaxHeaderNesting = 32;
// Longer arrays are dropped while parsing, so a corrupt shape cannot balloon into a huge DOM.
constexpr size_t kMaxArrayItems = 64;

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

// The exception's own message without its "[json.exception.type_error.316] " prefix.
std::string json_error_text(const nlohmann::json::exception& e) {
  const std::string text = e.what();
  const size_t prefix_end = text.rfind("[json.exception.", 0) == 0 ? text.find("] ") : text.npos;
  return prefix_end == text.npos ? text : text.substr(prefix_end + 2);
}

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

}  // namespace ft
