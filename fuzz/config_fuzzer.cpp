// libFuzzer target: the YAML config reader (app/config/config.cpp) with `--set` overrides.
// Input: a config file's content, optionally followed by a line "#--set"; every line after it is
// one `--set` override (at most 8; blank lines skipped). The content goes to parse_config, which
// load_config calls with a file's bytes (load_config itself zero-fills a 4 MiB read buffer per
// call, which would make this target 15 times slower; its file checks are not parsing).
// Refusals (ft::Error) are fine. A config that loads must survive a round trip: config_to_yaml's
// text parses again (parse_config) to the same values (flatten_config), as config.h promises.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "core/check.h"
#include "fuzz/fuzz_util.h"

namespace {

constexpr char kSetMarker[] = "\n#--set\n";
constexpr size_t kMaxOverrides = 8;

void split_input(const std::string& input, std::string* text, std::vector<std::string>* overrides) {
  const size_t marker = input.find(kSetMarker);
  *text = input.substr(0, marker);
  if (marker == std::string::npos) return;
  size_t start = marker + sizeof(kSetMarker) - 1;
  while (start <= input.size() && overrides->size() < kMaxOverrides) {
    size_t end = input.find('\n', start);
    if (end == std::string::npos) end = input.size();
    if (end > start) overrides->push_back(input.substr(start, end - start));
    start = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ft_fuzz::silence_stdout();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string text;
  std::vector<std::string> overrides;
  split_input(input, &text, &overrides);

  ft::Config config;
  try {
    config = ft::parse_config(text, "fuzz.yaml", overrides);
  } catch (const ft::Error&) {
    return 0;  // a clean refusal
  }

  const std::string dumped = ft::config_to_yaml(config);
  ft::Config again;
  try {
    again = ft::parse_config(dumped, "round trip");
  } catch (const ft::Error& error) {
    ft_fuzz::finding("config_to_yaml's output does not parse again: " + std::string(error.what()) +
                     "\n--- dumped config ---\n" + dumped);
  }
  if (ft::flatten_config(again) != ft::flatten_config(config))
    ft_fuzz::finding("config_to_yaml's output parses to other values:\n--- first ---\n" + dumped +
                     "--- again ---\n" + ft::config_to_yaml(again));
  return 0;
}
