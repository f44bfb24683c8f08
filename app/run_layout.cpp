#include "app/run_layout.h"

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "app/flag_checks.h"
#include "core/check.h"

namespace ft {
namespace {

// Checkpoints (*.safetensors directly in `directory`); none when it does not exist.
int count_checkpoints(const std::string& directory) {
  std::error_code ec;
  std::filesystem::directory_iterator it(directory, ec);
  if (ec) return 0;
  int count = 0;
  for (const std::filesystem::directory_entry& entry : it)
    if (entry.path().extension() == ".safetensors") ++count;
  return count;
}

}  // namespace

// "1:05" or "1:02:05".
std::string clock_text(double seconds) {
  const long total = static_cast<long>(seconds + 0.5);
  char text[32];
  if (total >= 3600)
    std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", total / 3600, total / 60 % 60, total % 60);
  else
    std::snprintf(text, sizeof(text), "%ld:%02ld", total / 60, total % 60);
  return text;
}

// train.run_dir and train.checkpoint_dir when left empty: runs/<config stem>-<rank 0's local
// time>, and <run_dir>/checkpoints. Every rank gets rank 0's time.
Config resolve_run_layout(Config config, Communicator* comm) {
  if (config.train.run_dir.empty()) {
    float now[2] = {0, 0};  // seconds since the epoch, split so that floats hold it exactly
    const long long seconds = static_cast<long long>(std::time(nullptr));
    now[0] = static_cast<float>(seconds >> 16);
    now[1] = static_cast<float>(seconds & 0xffff);
    if (comm != nullptr) comm->broadcast(now, 2, 0);
    const std::time_t start =
        (static_cast<std::time_t>(now[0]) << 16) | static_cast<std::time_t>(now[1]);
    char stamp[32];
    std::tm local{};
    localtime_r(&start, &local);
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
    const std::string stem = std::filesystem::path(config.source_path).stem().string();
    config.train.run_dir = "runs/" + (stem.empty() ? std::string("run") : stem) + "-" + stamp;
  }
  if (config.train.checkpoint_dir.empty())
    config.train.checkpoint_dir =
        (std::filesystem::path(config.train.run_dir) / "checkpoints").string();
  return config;
}

void require_writable_run_layout(const Config& config, const std::string& json_path) {
  require_writable_directory("train.run_dir", config.train.run_dir);
  require_writable_directory("train.checkpoint_dir", config.train.checkpoint_dir);
  if (!config.train.trace.empty())
    require_writable_file("train.trace", config.train.trace, OutputWrite::kAtomic);
  if (json_path.empty()) return;
  // --json opens after config.yaml has created the run directory: in one still to be made it
  // needs only what the run directory needs, checked above.
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path run_dir = fs::weakly_canonical(config.train.run_dir, error);
  const bool in_new_run_dir =
      !error && !fs::exists(run_dir, error) &&
      fs::weakly_canonical(fs::path(json_path).parent_path(), error) == run_dir && !error;
  if (!in_new_run_dir) require_writable_file("--json", json_path, OutputWrite::kInPlace);
}

// runs/latest -> the run dir, when the run dir was named automatically. A real directory there
// (an older layout) is left alone.
void point_latest_at(const std::string& run_dir) {
  const std::filesystem::path latest = std::filesystem::path(run_dir).parent_path() / "latest";
  std::error_code error;
  if (std::filesystem::exists(latest, error) && !std::filesystem::is_symlink(latest, error)) return;
  std::filesystem::remove(latest, error);
  std::filesystem::create_directory_symlink(std::filesystem::path(run_dir).filename(), latest,
                                            error);
}

// The settings a reader needs at start: what differs from the defaults in fusion, comm and
// inference (the full config is in <run_dir>/config.yaml).
std::string non_default_settings(const Config& config) {
  const auto defaults = flatten_config(Config{});
  std::string changed;
  for (const auto& [key, value] : flatten_config(config)) {
    if (key.rfind("fusion.", 0) != 0 && key.rfind("comm.", 0) != 0 &&
        key.rfind("inference.fold_bn", 0) != 0)
      continue;
    for (const auto& [default_key, default_value] : defaults)
      if (default_key == key && default_value != value) changed += " " + key + "=" + value;
  }
  return changed.empty() ? " (fusion and comm at their defaults)" : changed;
}

// A fresh run must not write its step_N files over another run's: rank 0 looks (it is the one
// that writes), every rank follows its answer.
void refuse_to_overwrite(const Config& config, Communicator* comm, bool is_root) {
  if (!config.train.resume.empty() || config.train.overwrite) return;
  float found = is_root ? static_cast<float>(count_checkpoints(config.train.checkpoint_dir)) : 0;
  if (comm != nullptr) comm->broadcast(&found, 1, 0);
  FT_REQUIRE(found == 0, "train.checkpoint_dir '", config.train.checkpoint_dir, "' already holds ",
             static_cast<int>(found),
             " checkpoint(s) (*.safetensors), and this is a fresh run (no train.resume) that would "
             "overwrite them; resume with train.resume: PATH, choose another "
             "train.checkpoint_dir, or set train.overwrite: true to write there anyway");
}

void JsonLinesFile::open(const std::string& path) {
  path_ = path;
  out_.open(path);
  FT_REQUIRE(out_.good(), "cannot open --json file '", path, "' for writing");
}

void JsonLinesFile::write(const nlohmann::json& row, bool flush) {
  out_ << row.dump() << "\n";
  if (flush) out_.flush();
  require_good();
}

void JsonLinesFile::close() {
  out_.flush();
  require_good();
  out_.close();
  require_good();
}

void JsonLinesFile::require_good() {
  FT_REQUIRE(!out_.fail(), "writing --json file '", path_, "' failed (disk full or not writable?)");
}

std::string checkpoint_path(const Config& config, int step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step_%06d.safetensors", step);
  return (std::filesystem::path(config.train.checkpoint_dir) / name).string();
}

}  // namespace ft
