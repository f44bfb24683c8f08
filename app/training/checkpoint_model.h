// Whether a config describes the model a checkpoint or export holds, checked before any model is
// built: otherwise eval, export and sample would only say "checkpoint has no tensor 'wte.weight'"
// or name a shape, which hides the real mistake (a config of another model or size).
// Thread safety: pure functions.
#pragma once
#include <string>
#include <vector>

#include "app/config/config.h"
#include "core/safetensors.h"

namespace ft {

// Where a job's model.* keys came from, for the messages below: "--set" when an override sets
// a model.* key, else "--config <path>", else the checkpoint's embedded config.
std::string model_config_source(const std::vector<std::string>& overrides,
                                const std::string& config_path);

// Throws ft::Error naming `path`, the first differing key with both values, and `config_source`,
// when `config` describes another model than `file` stores: model.arch (metadata 'arch') first,
// then the keys that shape its tensors (from the embedded config of a checkpoint, or the 'model'
// metadata of an export). Keys the file does not record are not compared.
void require_same_model(const SafetensorsFile& file, const std::string& path, const Config& config,
                        const std::string& config_source);

// The config eval and export run `checkpoint` (read from `checkpoint_path`) with: `config_path`
// with `overrides` when a path is given, else the checkpoint's embedded config with them. Checked
// with require_same_model before it is returned, so no model of the wrong kind is ever built.
Config config_for_checkpoint(const SafetensorsFile& checkpoint, const std::string& checkpoint_path,
                             const std::string& config_path,
                             const std::vector<std::string>& overrides);

}  // namespace ft
