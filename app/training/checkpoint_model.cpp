// Checking a config against a stored model (see checkpoint_model.h).
#include "app/training/checkpoint_model.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "app/training/file_formats.h"
#include "app/training/trainer.h"
#include "core/check.h"

namespace ft {
namespace {

// The model.* keys that decide which tensors a model has and their shapes, arch first.
const std::vector<std::string>& shape_keys() {
  static const std::vector<std::string> keys = {"arch",    "n_layer",       "n_head",
                                                "d_model", "seq_len",       "vocab_size",
                                                "qk_norm", "resnet_blocks", "resnet_width"};
  return keys;
}

// "model.<key>" -> value, as flatten_config writes them, for the keys that describe `arch`.
bool describes(const std::string& arch, const std::string& key) {
  if (key == "arch") return true;
  const bool resnet_key = key.rfind("resnet_", 0) == 0;
  return arch == "resnet" ? resnet_key : !resnet_key;
}

// What the file records of its model: metadata 'arch', and the embedded config (a checkpoint)
// or the 'model' metadata (an export).
std::map<std::string, std::string> stored_model(const SafetensorsFile& file,
                                                const std::string& path) {
  std::map<std::string, std::string> stored;
  if (auto arch = file.metadata.find("arch"); arch != file.metadata.end())
    stored["arch"] = arch->second;
  if (file.metadata.count("config") > 0) {
    try {
      for (const auto& [key, value] : flatten_config(checkpoint_config(file, path, {})))
        if (key.rfind("model.", 0) == 0) stored.emplace(key.substr(6), value);
    } catch (const Error&) {
      // An embedded config that no longer parses: the tensor checks still say what is wrong.
    }
  } else if (auto model = file.metadata.find("model"); model != file.metadata.end()) {
    const nlohmann::json fields = nlohmann::json::parse(model->second, nullptr, false);
    if (fields.is_object())
      for (const auto& [key, value] : fields.items())
        stored.emplace(key, value.is_string() ? value.get<std::string>() : value.dump());
  }
  return stored;
}

}  // namespace

std::string model_config_source(const std::vector<std::string>& overrides,
                                const std::string& config_path) {
  if (std::any_of(overrides.begin(), overrides.end(),
                  [](const std::string& set) { return set.rfind("model.", 0) == 0; }))
    return "--set";
  if (!config_path.empty()) return "--config " + config_path;
  return "its embedded config (metadata 'config')";
}

void require_same_model(const SafetensorsFile& file, const std::string& path, const Config& config,
                        const std::string& config_source) {
  const std::map<std::string, std::string> stored = stored_model(file, path);
  std::map<std::string, std::string> wanted;
  for (const auto& [key, value] : flatten_config(config))
    if (key.rfind("model.", 0) == 0) wanted[key.substr(6)] = value;
  const auto arch = stored.find("arch");
  if (arch == stored.end()) return;
  for (const std::string& key : shape_keys()) {
    const auto found = stored.find(key);
    if (!describes(arch->second, key) || found == stored.end() || found->second == wanted[key])
      continue;
    const auto format = file.metadata.find("format");
    const std::string kind =
        format != file.metadata.end() && format->second == kExportFormat ? "export" : "checkpoint";
    const std::string what = key == "arch"
                                 ? "is a '" + arch->second + "' model (metadata 'arch')"
                                 : "holds a model with model." + key + " '" + found->second + "'";
    FT_FAIL(path, ": the ", kind, " ", what, ", but ", config_source, " says model.", key, " '",
            wanted[key],
            "'; pass the config the checkpoint was trained with, or no --config to use the one "
            "stored in it");
  }
}

Config config_for_checkpoint(const SafetensorsFile& checkpoint, const std::string& checkpoint_path,
                             const std::string& config_path,
                             const std::vector<std::string>& overrides) {
  const Config config = config_path.empty()
                            ? checkpoint_config(checkpoint, checkpoint_path, overrides)
                            : load_config(config_path, overrides);
  require_same_model(checkpoint, checkpoint_path, config,
                     model_config_source(overrides, config_path));
  return config;
}

}  // namespace ft
