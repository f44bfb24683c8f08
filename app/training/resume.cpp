// Resolving train's config, resume included (see resume.h).
#include "app/training/resume.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "app/training/trainer.h"
#include "core/check.h"
#include "core/safetensors.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

bool is_directory(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error);
}

// Keys a resumed run must keep: another model or optimizer would not match the checkpoint's
// tensors and state. The learning rate and its schedule may change (as after a divergence).
bool fixed_on_resume(const std::string& key) {
  return key.rfind("model.", 0) == 0 || key == "optim.name";
}

// Refuses a model.* or optim.* key of `wanted` that differs from the run's.
void require_same_model_and_optimizer(const Config& run, const std::string& run_origin,
                                      const Config& wanted, const std::string& wanted_origin) {
  std::map<std::string, std::string> run_values;
  for (const auto& [key, value] : flatten_config(run)) run_values[key] = value;
  for (const auto& [key, value] : flatten_config(wanted)) {
    if (!fixed_on_resume(key) || run_values[key] == value) continue;
    FT_FAIL("train --resume: ", key, " is '", run_values[key], "' in the run (", run_origin,
            ") but '", value, "' in ", wanted_origin,
            "; a resumed run keeps its model.* keys and optim.name: drop the change, or start a "
            "fresh run with --config");
  }
}

// Where `stored` (a path the run wrote in its config.yaml) lies when the run folder is now
// `run_dir`: under the stored run dir it moves with the folder (which may have been given
// another path, relative to another directory); elsewhere it stays.
std::string moved_with_run_dir(const std::string& stored, const std::string& stored_run_dir,
                               const std::string& run_dir) {
  const fs::path relative = fs::path(stored).lexically_relative(stored_run_dir);
  if (relative.empty() || *relative.begin() == "..") return stored;
  return (fs::path(run_dir) / relative).lexically_normal().string();
}

// The regular file in `dir` named `pattern` (whose group 1 is a step number) with the largest
// step, where `zero_step_name` counts as step 0; "" when there is none.
std::string newest_step_file(const std::string& dir, const std::regex& pattern,
                             const std::string& zero_step_name = "") {
  std::error_code error;
  std::string newest;
  long long newest_step = -1;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(error)) continue;
    const long long step = name == zero_step_name                   ? 0
                           : std::regex_match(name, match, pattern) ? std::stoll(match[1].str())
                                                                    : -1;
    if (step > newest_step) newest_step = step, newest = entry.path().string();
  }
  return newest;
}

// The run's config as its last part ran: config.resume-<step>.yaml of the latest resume, else
// config.yaml (see train_job.cpp), or "" when the folder has neither.
std::string latest_run_config(const std::string& run_dir) {
  static const std::regex kResumeConfig("config\\.resume-([0-9]+)\\.yaml");
  return newest_step_file(run_dir, kResumeConfig, "config.yaml");
}

// The config of a resume from the run folder `run_dir`.
Config resume_from_run_dir(const TrainConfigRequest& request, const std::string& run_dir) {
  const std::string run_config_path = latest_run_config(run_dir);
  FT_REQUIRE(!run_config_path.empty(), "train --resume ", run_dir,
             ": not a run folder (it has no config.yaml); pass the folder `train` printed as "
             "\"run dir\", or a checkpoint file");
  const Config run = load_config(run_config_path);
  Config config = request.config_path.empty() ? load_config(run_config_path, request.overrides)
                                              : load_config(request.config_path, request.overrides);
  require_same_model_and_optimizer(
      run, run_config_path, config,
      request.config_path.empty() ? "--set" : request.config_path + " and --set");
  config.train.run_dir = run_dir;
  config.train.checkpoint_dir =
      moved_with_run_dir(run.train.checkpoint_dir, run.train.run_dir, run_dir);
  config.train.resume = newest_checkpoint(config.train.checkpoint_dir);
  FT_REQUIRE(!config.train.resume.empty(), "train --resume ", run_dir, ": its checkpoint folder ",
             config.train.checkpoint_dir,
             " holds no step_*.safetensors (the run stopped before its first checkpoint); start "
             "it again with --config ",
             run_config_path);
  return config;
}

// The config of a resume from the checkpoint file `path`.
Config resume_from_checkpoint(const TrainConfigRequest& request, const std::string& path) {
  if (!request.config_path.empty()) {
    Config config = load_config(request.config_path, request.overrides);
    config.train.resume = path;
    return config;
  }
  const SafetensorsFile file = load_checkpoint_file(path);
  const Config embedded = checkpoint_config(file, path, {});
  Config config = checkpoint_config(file, path, request.overrides);
  require_same_model_and_optimizer(embedded, path + " (embedded config)", config, "--set");
  config.train.resume = path;
  return config;
}

// Keeps the checkpoint's global batch on `world_size` ranks; returns the note, or "".
std::string keep_global_batch(Config& config, int world_size) {
  const SafetensorsFile file = load_checkpoint_file(config.train.resume);
  const auto stored = file.metadata.find("data_state");
  if (stored == file.metadata.end()) return "";  // an older checkpoint: ranks unknown
  const nlohmann::json states = nlohmann::json::parse(stored->second, nullptr, false);
  if (!states.is_array() || states.empty()) return "";  // loading says what is wrong
  const int saved_ranks = static_cast<int>(states.size());
  if (saved_ranks == world_size) return "";
  const Config saved = checkpoint_config(file, config.train.resume, {});
  const int64_t global = int64_t{saved.train.batch_size} * saved.train.grad_accum * saved_ranks;
  const int batch = config.train.batch_size, accum = config.train.grad_accum;
  const std::string was = "the checkpoint was written by " + std::to_string(saved_ranks) +
                          " rank(s) with a global batch of " + std::to_string(global) +
                          " (train.batch_size " + std::to_string(saved.train.batch_size) +
                          " x train.grad_accum " + std::to_string(saved.train.grad_accum) + " x " +
                          std::to_string(saved_ranks) + " ranks)";
  if (int64_t{batch} * accum * world_size == global) return "";
  if (global % (int64_t{batch} * world_size) == 0) {
    config.train.grad_accum = static_cast<int>(global / (int64_t{batch} * world_size));
    return was + "; on " + std::to_string(world_size) + " rank(s) train.grad_accum is " +
           std::to_string(config.train.grad_accum) + " (was " + std::to_string(accum) +
           ") to keep it";
  }
  if (global % (int64_t{accum} * world_size) == 0) {
    config.train.batch_size = static_cast<int>(global / (int64_t{accum} * world_size));
    return was + "; on " + std::to_string(world_size) + " rank(s) train.batch_size is " +
           std::to_string(config.train.batch_size) + " (was " + std::to_string(batch) +
           ") to keep it";
  }
  FT_FAIL(config.train.resume, ": ", was, ", which ", world_size,
          " rank(s) cannot keep (it is not a multiple of ", world_size,
          " x train.batch_size or of ", world_size,
          " x train.grad_accum); resume on a number of ranks that divides it, e.g. ", saved_ranks);
}

}  // namespace

std::string newest_checkpoint(const std::string& checkpoint_dir) {
  static const std::regex kStepFile("step_([0-9]+)\\.safetensors");
  return newest_step_file(checkpoint_dir, kStepFile);
}

std::string resume_command(const std::string& program, const std::string& run_dir, int world_size) {
  const std::string launcher =
      world_size > 1 ? "mpirun -np " + std::to_string(world_size) + " " : "";
  return launcher + program + " train --resume " + run_dir;
}

ResolvedTrainConfig resolve_train_config(const TrainConfigRequest& request, int world_size) {
  ResolvedTrainConfig resolved;
  std::string target = request.resume_path;
  if (target.empty()) {  // train.resume, from the config file or --set
    resolved.config =
        load_config(request.config_path.empty() ? request.default_config_path : request.config_path,
                    request.overrides);
    target = resolved.config.train.resume;
  }
  if (is_directory(target))
    resolved.config = resume_from_run_dir(request, target);
  else if (!target.empty() && (request.config_path.empty() || !request.resume_path.empty()))
    resolved.config = resume_from_checkpoint(request, target);
  if (!resolved.config.train.resume.empty()) {
    const std::string note = keep_global_batch(resolved.config, world_size);
    if (!note.empty()) resolved.notes.push_back("note: " + note);
  }
  return resolved;
}

}  // namespace ft
