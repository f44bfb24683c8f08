// Checkpoints: one safetensors file with every parameter and buffer under its canonical name,
// optimizer state under "optim.<slot>.<name>", and metadata (config, step, format).
// Loading checks everything a checkpoint claims: the format, every tensor finite, every tensor
// one the model has (and of its shape), and the step counters in range.
#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "app/training/file_formats.h"
#include "app/training/trainer.h"
#include "comm/gather.h"
#include "core/check.h"
#include "core/safetensors.h"

namespace ft {
namespace {

constexpr size_t kMaxListedTensors = 32;

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

// True for a model tensor, or for optimizer state "optim.<slot>.<param>" of one.
bool known_tensor(const std::string& name, const ParamStore& params) {
  if (params.find(name) >= 0) return true;
  const std::string prefix = "optim.";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dot = name.find('.', prefix.size());
  return dot != std::string::npos && params.find(name.substr(dot + 1)) >= 0;
}

// A checkpoint of another model (more layers, another head) must not load silently in part.
void require_no_unknown_tensors(const SafetensorsFile& file, const ParamStore& params,
                                const std::string& path) {
  std::vector<std::string> unknown;
  for (const auto& [name, entry] : file.tensors)
    if (!known_tensor(name, params)) unknown.push_back(name);
  if (unknown.empty()) return;
  std::string listed;
  for (size_t i = 0; i < unknown.size() && i < kMaxListedTensors; ++i)
    listed += (i ? ", " : "") + unknown[i];
  if (unknown.size() > kMaxListedTensors)
    listed += ", ... (" + std::to_string(unknown.size() - kMaxListedTensors) + " more)";
  FT_FAIL(path, ": checkpoint has ", unknown.size(), " tensor(s) the model does not have: ", listed,
          "; the config's model.* keys must describe the checkpoint's model");
}

// A view of a loaded entry's floats, for copy_from into a tensor on any device.
Tensor host_tensor(const SafetensorsEntry& entry, const Shape& shape) {
  return Tensor::wrap(const_cast<float*>(entry.data.data()), shape);
}

}  // namespace

void require_checkpoint_tensors(const SafetensorsFile& file, const std::string& path,
                                const ParamStore& params) {
  for (ParamId id = 0; id < params.size(); ++id)
    find_entry(file, params[id].name, params[id].shape, path);
  require_no_unknown_tensors(file, params, path);
}

namespace {

void copy_params(const SafetensorsFile& file, ParamStore& params, const std::string& path) {
  for (ParamId id = 0; id < params.size(); ++id) {
    Param& param = params[id];
    const SafetensorsEntry& entry = find_entry(file, param.name, param.shape, path);
    param.value.copy_from(host_tensor(entry, param.shape));
  }
  require_no_unknown_tensors(file, params, path);
  params.mark_changed();
}

// The integer metadata `key` (absent: `fallback`, or an error when there is none), which must be
// written in full as a decimal in [lo, hi]; `range` says where the bounds come from.
int metadata_int(const SafetensorsFile& file, const std::string& key, const std::string& path,
                 int64_t lo, int64_t hi, const std::string& range, const int* fallback = nullptr) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end()) {
    if (fallback != nullptr) return *fallback;
    FT_FAIL(path, ": checkpoint metadata has no '", key, "'");
  }
  const std::string& text = it->second;
  int64_t value = 0;
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(text.data(), last, value);
  if (error == std::errc::result_out_of_range)
    FT_FAIL(path, ": checkpoint metadata '", key, "' is '", text, "', out of range (", range, ")");
  if (error != std::errc() || end != last || text.empty())
    FT_FAIL(path, ": checkpoint metadata '", key, "' is not an integer: '", text, "'");
  if (value < lo || value > hi)
    FT_FAIL(path, ": checkpoint metadata '", key, "' is ", value, ", out of range (", range, ")");
  return static_cast<int>(value);
}

void require_finite_tensors(const SafetensorsFile& file, const std::string& path) {
  for (const auto& [name, entry] : file.tensors)
    for (size_t i = 0; i < entry.data.size(); ++i)
      if (!std::isfinite(entry.data[i]))
        FT_FAIL(path, ": tensor '", name, "' holds a non-finite value (", entry.data[i],
                " at element ", i, "); the checkpoint is unusable");
}

// The optimizer state slots a checkpoint holds, "exp_avg" for "optim.exp_avg.wte.weight".
std::set<std::string> slots_in(const SafetensorsFile& file) {
  std::set<std::string> slots;
  const std::string prefix = "optim.";
  for (const auto& [name, entry] : file.tensors) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    if (dot != std::string::npos) slots.insert(name.substr(prefix.size(), dot - prefix.size()));
  }
  return slots;
}

std::string slots_text(const std::set<std::string>& slots) {
  if (slots.empty()) return "no optimizer state";
  std::string text;
  for (const std::string& slot : slots)
    text += (text.empty() ? "optim." : ", optim.") + slot + ".*";
  return text;
}

// The model.arch a checkpoint was trained with: its 'arch' metadata, else its embedded config's
// (older files), else "" when neither tells.
std::string checkpoint_arch(const SafetensorsFile& file, const std::string& path) {
  auto arch = file.metadata.find("arch");
  if (arch != file.metadata.end()) return arch->second;
  try {
    return checkpoint_config(file, path, {}).model.arch;
  } catch (const Error&) {
    return "";  // the tensor checks still say what is wrong
  }
}

// Another optimizer's state must not fail as one missing tensor: say which optimizer wrote it.
void require_same_optimizer(const SafetensorsFile& file, const std::string& path,
                            const std::string& optimizer,
                            const std::vector<std::pair<std::string, Tensor*>>& needed) {
  std::set<std::string> wanted;
  for (const auto& [slot, state] : needed) wanted.insert(slot);
  const std::set<std::string> found = slots_in(file);
  if (found == wanted) return;
  std::string written_by;
  try {
    written_by = checkpoint_config(file, path, {}).optim.name;
  } catch (const Error&) {
    // Its embedded config does not parse here; the tensors alone still tell what is wrong.
  }
  FT_FAIL(path, ": checkpoint was written by ",
          written_by.empty() ? std::string("another optimizer") : "optimizer " + written_by,
          " (it holds ", slots_text(found), "), but this run's optim.name = ", optimizer, " needs ",
          slots_text(wanted), "; resume with the optimizer it was trained with",
          written_by.empty() || written_by == optimizer ? std::string()
                                                        : " (optim.name " + written_by + ")",
          ", or start a fresh run without train.resume");
}

// The first non-finite float of `count` at `data`, or -1.
int64_t first_non_finite(const float* data, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(data[i])) return i;
  return -1;
}

}  // namespace

SafetensorsFile load_checkpoint_file(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  require_checkpoint(file, path);
  return file;
}

void require_checkpoint(const SafetensorsFile& file, const std::string& path) {
  auto format = file.metadata.find("format");
  // An export has the trained weights but not the optimizer state or counters a checkpoint has;
  // the way out is the checkpoint it names as its source.
  if (format != file.metadata.end() && format->second == kExportFormat) {
    auto source = file.metadata.find("source_checkpoint");
    FT_FAIL(path, " is an export (metadata 'format' '", kExportFormat,
            "'), not a training checkpoint; sample, eval, export, train.resume and "
            "infer --compare-unfolded read training checkpoints: pass the checkpoint it was "
            "exported from (metadata source_checkpoint: ",
            source == file.metadata.end() ? std::string("absent") : source->second, ")");
  }
  if (format == file.metadata.end() || format->second != kCheckpointFormat)
    FT_FAIL(path, ": not a fusiontrain checkpoint (metadata 'format' should be '",
            kCheckpointFormat, "')");
  require_finite_tensors(file, path);
}

Trainer::HostState Trainer::host_state() {
  // On cuda, one copy per flat buffer (a few, not one per tensor); on cpu the buffers themselves.
  auto on_host = [](const Tensor& tensor) {
    return tensor.device() == Device::kCpu ? tensor : tensor.to(Device::kCpu);
  };
  HostState state;
  state.values = on_host(params_.flat_values());
  state.buffers = on_host(params_.flat_buffers());
  for (auto& [slot, tensor] : optimizer_->state_slots())
    state.optimizer.emplace_back(slot, on_host(*tensor));
  return state;
}

const float* Trainer::HostState::param_data(const Param& param) const {
  return (param.trainable ? values : buffers).data() + param.offset;
}

void Trainer::require_finite_state(const std::string& path, const HostState& host) const {
  std::string bad;
  for (ParamId id = 0; id < params_.size() && bad.empty(); ++id) {
    const Param& param = params_[id];
    const float* data = host.param_data(param);
    const int64_t at = first_non_finite(data, param.value.numel());
    if (at >= 0) bad = "parameter '" + param.name + "' holds " + std::to_string(data[at]);
  }
  for (const auto& [slot, state] : host.optimizer) {
    if (!bad.empty()) break;
    for (ParamId id = 0; id < params_.size() && bad.empty(); ++id) {
      const Param& param = params_[id];
      if (!param.trainable) continue;
      const float* data = state.data() + param.offset;
      const int64_t at = first_non_finite(data, param.value.numel());
      if (at >= 0)
        bad = "optimizer state '" + slot_name(slot, param.name) + "' holds " +
              std::to_string(data[at]);
    }
  }
  if (bad.empty()) return;
  FT_FAIL("refusing to write checkpoint '", path, "' at step ", step_, ": ", bad,
          "; a checkpoint is never written from a non-finite state; ", last_checkpoint_text());
}

std::string Trainer::last_checkpoint_text() const {
  if (!writes_checkpoints_) return "this job measures steps and writes no checkpoints";
  if (!last_checkpoint_.empty()) return "last good checkpoint: " + last_checkpoint_;
  if (!config_.train.resume.empty())
    return "no checkpoint written yet (resumed from " + config_.train.resume + ")";
  return "no checkpoint written yet";
}

void Trainer::save_checkpoint(const std::string& path) {
  // Every rank checks (the parameters are the same on all), so all of them stop together.
  const HostState host = host_state();
  require_finite_state(path, host);
  // Every rank's place in its data stream, so a resume restores it instead of replaying it.
  const std::vector<std::string> data_states = comm_ != nullptr
                                                   ? gather_strings(*comm_, task_->data_state(), 0)
                                                   : std::vector<std::string>{task_->data_state()};
  if (comm_ != nullptr && comm_->rank() != 0) {
    last_checkpoint_ = path;
    return;
  }
  std::filesystem::path directory = std::filesystem::path(path).parent_path();
  if (directory.empty()) directory = ".";
  if (cleaned_dirs_.insert(directory.string()).second)
    for (const std::string& stale : remove_stale_temp_files(directory.string()))
      std::printf("removed stale temp file %s (its writer is gone)\n", stale.c_str());
  std::vector<SafetensorsView> views;
  for (ParamId id = 0; id < params_.size(); ++id) {
    const Param& param = params_[id];
    views.push_back({param.name, param.shape, host.param_data(param)});
  }
  for (const auto& [slot, state] : host.optimizer)
    for (ParamId id = 0; id < params_.size(); ++id) {
      const Param& param = params_[id];
      if (param.trainable)
        views.push_back({slot_name(slot, param.name), param.shape, state.data() + param.offset});
    }
  const std::map<std::string, std::string> metadata{
      {"format", kCheckpointFormat},
      {"step", std::to_string(step_)},
      {"optimizer_steps", std::to_string(optimizer_->steps_taken())},
      {"skipped_steps", std::to_string(skipped_steps_)},
      {"arch", config_.model.arch},
      {"config", config_to_yaml(config_)},
      {"data_state", nlohmann::json(data_states).dump()}};
  save_safetensors(path, metadata, views);
  last_checkpoint_ = path;
}

void Trainer::load_checkpoint(const std::string& path) {
  const SafetensorsFile file = load_checkpoint_file(path);
  // Another model's checkpoint would otherwise fail on its optimizer state or one missing tensor,
  // which hides the real mistake.
  const std::string arch = checkpoint_arch(file, path);
  FT_REQUIRE(arch.empty() || arch == config_.model.arch, path,
             ": train.resume: the checkpoint is a '", arch,
             "' model (metadata 'arch'), but this run's model.arch is '", config_.model.arch,
             "'; resume a checkpoint of this model (train with the config it was trained with), "
             "or start a fresh run without train.resume");
  // Counters first: a wild step would otherwise replay billions of batches or wrap around.
  const int total_steps = config_.train.steps;
  const int step = metadata_int(file, "step", path, 0, total_steps,
                                "0 to train.steps = " + std::to_string(total_steps));
  const int optimizer_steps = metadata_int(file, "optimizer_steps", path, 0, step,
                                           "0 to the checkpoint's step = " + std::to_string(step));
  const int no_skips = 0;
  const int skipped =
      metadata_int(file, "skipped_steps", path, 0, step,
                   "0 to the checkpoint's step = " + std::to_string(step), &no_skips);
  require_same_optimizer(file, path, config_.optim.name, optimizer_->state_slots());
  copy_params(file, params_, path);
  for (auto& [slot, state] : optimizer_->state_slots())
    for (ParamId id = 0; id < params_.size(); ++id) {
      const Param& param = params_[id];
      if (!param.trainable) continue;
      const SafetensorsEntry& entry =
          find_entry(file, slot_name(slot, param.name), param.shape, path);
      Tensor::wrap(state->data() + param.offset, param.shape, state->device())
          .copy_from(host_tensor(entry, param.shape));
    }
  step_ = step;
  skipped_steps_ = skipped;
  optimizer_->set_steps_taken(optimizer_steps);
  restore_data_position(file, path);
}

void Trainer::restore_data_position(const SafetensorsFile& file, const std::string& path) {
  const int rank = comm_ != nullptr ? comm_->rank() : 0;
  auto stored = file.metadata.find("data_state");
  if (stored != file.metadata.end()) {
    const nlohmann::json states = nlohmann::json::parse(stored->second, nullptr, false);
    FT_REQUIRE(
        states.is_array() && std::all_of(states.begin(), states.end(),
                                         [](const nlohmann::json& s) { return s.is_string(); }),
        path, ": checkpoint metadata 'data_state' is not a JSON list of strings");
    if (static_cast<int>(states.size()) == world_size_) {
      task_->set_data_state(states[static_cast<size_t>(rank)].get<std::string>(),
                            path + " (metadata data_state, rank " + std::to_string(rank) + ")");
      return;
    }
  }
  // An older checkpoint, or another number of ranks (whose shards differ anyway): replay the
  // stream from the step count, as before, within a bound a resume can afford.
  const int64_t batches = static_cast<int64_t>(step_) * config_.train.grad_accum;
  constexpr int64_t kMostReplayedBatches = 1000000;
  FT_REQUIRE(batches <= kMostReplayedBatches, path, ": the checkpoint holds no data position for ",
             world_size_, " rank(s), and replaying its ", batches,
             " batches to find it would take too long (at most ", kMostReplayedBatches,
             "); resume with the number of ranks that wrote it");
  task_->skip_train_batches(batches);
}

void load_checkpoint_params(const std::string& path, ParamStore& params) {
  copy_params(load_checkpoint_file(path), params, path);
}

void load_checkpoint_params(const SafetensorsFile& file, const std::string& path,
                            ParamStore& params) {
  copy_params(file, params, path);
}

Config checkpoint_config(const SafetensorsFile& file, const std::string& path,
                         const std::vector<std::string>& overrides) {
  auto it = file.metadata.find("config");
  if (it == file.metadata.end()) FT_FAIL(path, ": checkpoint metadata has no 'config'");
  return parse_config(it->second, path + " (embedded config)", overrides);
}

Config checkpoint_config(const std::string& path, const std::vector<std::string>& overrides) {
  return checkpoint_config(load_checkpoint_file(path), path, overrides);
}

}  // namespace ft
