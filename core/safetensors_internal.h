// Internal to core/safetensors.cpp, core/safetensors_file.cpp and core/safetensors_header.cpp
// (which defines these): header parsing shared by the in-memory decoder and the bounded file
// reader. Not a public API; include core/safetensors.h.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ft::safetensors_internal {

using Json = nlohmann::json;

inline constexpr char kMetadataKey[] = "__metadata__";

// Parses the header JSON, reporting duplicate keys (which nlohmann would silently collapse) and
// arrays longer than a small limit; throws ft::Error naming `origin`.
Json parse_header(std::string_view text, const std::string& origin);

// The exception's own message without its "[json.exception.type_error.316] " prefix.
std::string json_error_text(const nlohmann::json::exception& e);

// A JSON integer >= 0 that fits int64, or false.
bool to_count(const Json& value, int64_t* out);

// The little-endian header length in the first 8 bytes of `prefix`, checked against
// kSafetensorsMaxHeaderBytes and against the `following` bytes the file holds after it.
uint64_t header_length(const char* prefix, uint64_t following, const std::string& origin);

}  // namespace ft::safetensors_internal
