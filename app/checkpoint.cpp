// Checkpoints: one safetensors file with every parameter and buffer under its canonical name,
// optimizer state under "optim.<slot>.<name>", and metadata (config, step, format).
#include <cstring>

#include "app/trainer.h"
#include "core/check.h"
#include "core/safetensors.h"

namespace ft {
namespace {

constexpr const char* kFormat = "fusiontrain-checkpoint-1";

std::string slot_name(const std::string& slot, const std::string& param) {
  return "optim." + slot + "." + param;
}

const SafetensorsEntry& find_entry(const SafetensorsFile& file, const std::string& name,
                                   const Shape& shape, const std::string& path) {
  auto it = file.tensors.find(name);
  if (it == file.tensors.end()) FT_FAIL(path, ": checkpoint has no tensor '", name, "'");
  if (it->second.shape != shape)
    FT_FAIL(path, ": tensor '", name, "' has shape ", shape_str(it->second.shape), ", expected ",
            shape_str(shape));
  return it->second;
}

void copy_params(const SafetensorsFile& file, ParamStore& params, const std::string& path) {
  for (ParamId id = 0; id < params.size(); ++id) {
    Param& param = params[id];
    const SafetensorsEntry& entry = find_entry(file, param.name, param.shape, path);
    std::memcpy(param.value.data(), entry.data.data(), param.value.bytes());
  }
  params.mark_changed();
}

int64_t metadata_int(const SafetensorsFile& file, const std::string& key, const std::string& path) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end()) FT_FAIL(path, ": checkpoint metadata has no '", key, "'");
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    FT_FAIL(path, ": checkpoint metadata '", key, "' is not an integer: '", it->second, "'");
  }
}

SafetensorsFile load_checkpoint_file(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  auto format = file.metadata.find("format");
  if (format == file.metadata.end() || format->second != kFormat)
    FT_FAIL(path, ": not a fusiontrain checkpoint (metadata 'format' should be '", kFormat, "')");
  return file;
}

}  // namespace

void Trainer::save_checkpoint(const std::string& path) {
  if (comm_ != nullptr && comm_->rank() != 0) return;
  std::vector<SafetensorsView> views;
  for (ParamId id = 0; id < params_.size(); ++id) {
    const Param& param = params_[id];
    views.push_back({param.name, param.shape, param.value.data()});
  }
  for (auto& [slot, state] : optimizer_->state_slots())
    for (ParamId id = 0; id < params_.size(); ++id) {
      const Param& param = params_[id];
      if (param.trainable)
        views.push_back({slot_name(slot, param.name), param.shape, state->data() + param.offset});
    }
  const std::map<std::string, std::string> metadata{
      {"format", kFormat},
      {"step", std::to_string(step_)},
      {"optimizer_steps", std::to_string(optimizer_->steps_taken())},
      {"arch", config_.model.arch},
      {"config", config_to_yaml(config_)}};
  save_safetensors(path, metadata, views);
}

void Trainer::load_checkpoint(const std::string& path) {
  const SafetensorsFile file = load_checkpoint_file(path);
  copy_params(file, params_, path);
  for (auto& [slot, state] : optimizer_->state_slots())
    for (ParamId id = 0; id < params_.size(); ++id) {
      const Param& param = params_[id];
      if (!param.trainable) continue;
      const SafetensorsEntry& entry =
          find_entry(file, slot_name(slot, param.name), param.shape, path);
      std::memcpy(state->data() + param.offset, entry.data.data(), param.value.bytes());
    }
  step_ = static_cast<int>(metadata_int(file, "step", path));
  optimizer_->set_steps_taken(metadata_int(file, "optimizer_steps", path));
  task_->skip_train_batches(static_cast<int64_t>(step_) * config_.train.grad_accum);
}

void load_checkpoint_params(const std::string& path, ParamStore& params) {
  copy_params(load_checkpoint_file(path), params, path);
}

Config checkpoint_config(const std::string& path, const std::vector<std::string>& overrides) {
  const SafetensorsFile file = load_checkpoint_file(path);
  auto it = file.metadata.find("config");
  if (it == file.metadata.end()) FT_FAIL(path, ": checkpoint metadata has no 'config'");
  return parse_config(it->second, path + " (embedded config)", overrides);
}

}  // namespace ft
