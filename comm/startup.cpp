#include "comm/startup.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>

#include "core/check.h"

namespace ft {

namespace {

// The Communicator moves floats only. Integers below 2^24 and bytes survive the trip exactly, so
// hashes travel as 16-bit pieces and text as one byte per float.
constexpr int kHashPieces = 4;
constexpr size_t kMaxExactFloatInt = size_t{1} << 24;

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::vector<float> text_to_floats(const std::string& text) {
  std::vector<float> floats(text.size());
  for (size_t i = 0; i < text.size(); ++i) floats[i] = static_cast<unsigned char>(text[i]);
  return floats;
}

std::string floats_to_text(const float* floats, size_t count) {
  std::string text(count, '\0');
  for (size_t i = 0; i < count; ++i) text[i] = static_cast<char>(static_cast<int>(floats[i]));
  return text;
}

std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  FT_CHECK(text.size() < kMaxExactFloatInt, "text of ", text.size(), " bytes is too long to send");
  float length = static_cast<float>(text.size());
  comm.broadcast(&length, 1, root);
  std::vector<float> floats = text_to_floats(text);
  floats.resize(static_cast<size_t>(length));
  comm.broadcast(floats.data(), floats.size(), root);
  return floats_to_text(floats.data(), floats.size());
}

// Every rank's `text`, indexed by rank: each rank writes its own slot of a zeroed buffer and a
// sum-allreduce assembles them exactly.
std::vector<std::string> allgather_text(Communicator& comm, const std::string& text) {
  FT_CHECK(text.size() < kMaxExactFloatInt, "text of ", text.size(), " bytes is too long to send");
  const size_t ranks = static_cast<size_t>(comm.size());
  std::vector<float> lengths(ranks, 0.0f);
  lengths[comm.rank()] = static_cast<float>(text.size());
  comm.allreduce(lengths.data(), lengths.size(), ReduceOp::kSum);
  std::vector<size_t> starts(ranks + 1, 0);
  for (size_t r = 0; r < ranks; ++r) starts[r + 1] = starts[r] + static_cast<size_t>(lengths[r]);
  std::vector<float> all(starts[ranks], 0.0f);
  std::copy_n(text_to_floats(text).begin(), text.size(), all.begin() + starts[comm.rank()]);
  comm.allreduce(all.data(), all.size(), ReduceOp::kSum);
  std::vector<std::string> texts;
  for (size_t r = 0; r < ranks; ++r) {
    texts.push_back(floats_to_text(all.data() + starts[r], starts[r + 1] - starts[r]));
  }
  return texts;
}

// key=value lines, escaped so that the text parses back into the same pairs.
std::string flatten(const std::vector<std::pair<std::string, std::string>>& config) {
  std::string text;
  auto append_escaped = [&](const std::string& field) {
    for (char c : field) {
      if (c == '\\' || c == '\n' || c == '=') text += '\\';
      text += c == '\n' ? 'n' : c;
    }
  };
  for (const auto& [key, value] : config) {
    append_escaped(key);
    text += '=';
    append_escaped(value);
    text += '\n';
  }
  return text;
}

std::map<std::string, std::string> unflatten(const std::string& text) {
  std::map<std::string, std::string> config;
  std::string key, field;
  bool in_value = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\' && i + 1 < text.size()) {
      const char next = text[++i];
      field += next == 'n' ? '\n' : next;
    } else if (c == '=' && !in_value) {
      key = std::move(field);
      field.clear();
      in_value = true;
    } else if (c == '\n') {
      config[key] = std::move(field);
      key.clear();
      field.clear();
      in_value = false;
    } else {
      field += c;
    }
  }
  return config;
}

const std::string kMissing = "<missing>";

const std::string& value_or_missing(const std::map<std::string, std::string>& config,
                                    const std::string& key) {
  auto it = config.find(key);
  return it == config.end() ? kMissing : it->second;
}

}  // namespace

bool same_on_all_ranks(Communicator& comm, const std::string& text) {
  if (comm.size() == 1) return true;
  const uint64_t hash = fnv1a(text);
  float pieces[kHashPieces], root_pieces[kHashPieces];
  for (int i = 0; i < kHashPieces; ++i) {
    pieces[i] = root_pieces[i] = static_cast<float>((hash >> (16 * i)) & 0xffff);
  }
  comm.broadcast(root_pieces, kHashPieces, 0);
  // Everyone learns whether anyone differs, so every rank takes the same path afterwards.
  float mismatches = std::equal(pieces, pieces + kHashPieces, root_pieces) ? 0.0f : 1.0f;
  comm.allreduce(&mismatches, 1, ReduceOp::kSum);
  return mismatches == 0.0f;
}

void broadcast_parameters(Communicator& comm, ParamStore& params) {
  FT_CHECK(params.allocated(), "broadcast_parameters before ParamStore::allocate()");
  if (comm.size() == 1) return;
  for (Tensor* flat : {&params.flat_values(), &params.flat_buffers()}) {
    if (flat->device() == comm.buffer_device()) {
      comm.broadcast(flat->data(), flat->numel(), 0);
      continue;
    }
    // Device parameters over a host backend: through a host copy (once, at start-up).
    Tensor on_host = flat->to(Device::kCpu);
    comm.broadcast(on_host.data(), on_host.numel(), 0);
    flat->copy_from(on_host);
  }
  params.mark_changed();
}

void check_same_config(Communicator& comm,
                       const std::vector<std::pair<std::string, std::string>>& flat_config,
                       const std::string& origin) {
  const std::string text = flatten(flat_config);
  if (same_on_all_ranks(comm, text)) return;

  const std::map<std::string, std::string> root_config = unflatten(broadcast_text(comm, text, 0));
  const std::map<std::string, std::string> my_config = unflatten(text);
  std::ostringstream my_diff;
  auto compare = [&](const std::string& key) {
    const std::string& root_value = value_or_missing(root_config, key);
    const std::string& my_value = value_or_missing(my_config, key);
    if (root_value == my_value) return;
    my_diff << "\n  key '" << key << "': rank 0 = '" << root_value << "', rank " << comm.rank()
            << " = '" << my_value << "'";
  };
  for (const auto& entry : root_config) compare(entry.first);
  for (const auto& entry : my_config) {
    if (root_config.count(entry.first) == 0) compare(entry.first);
  }

  std::ostringstream message;
  message << "configuration differs across ranks (this rank " << comm.rank() << " read '" << origin
          << "'); every rank must run the same config:";
  bool any_value_differs = false;
  for (const std::string& diff : allgather_text(comm, my_diff.str())) {
    message << diff;
    any_value_differs = any_value_differs || !diff.empty();
  }
  if (!any_value_differs) message << " the same keys and values, but in a different order";
  FT_FAIL(message.str());
}

}  // namespace ft
