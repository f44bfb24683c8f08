// Where a training run writes, and what it says about itself at start: the run directory
// (runs/<config stem>-<timestamp> with runs/latest pointing at it), checkpoint names, the check
// that every output is writable, the refusal to write over another run's checkpoints, JSON Lines
// output that fails loudly, and the short start summary's list of settings that differ from the
// defaults. Used by app/train_job.cpp.
// Thread safety: called from the training thread; collective where a Communicator is passed.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "app/config.h"
#include "comm/communicator.h"

namespace ft {

// "1:05" or "1:02:05".
std::string clock_text(double seconds);

// train.run_dir and train.checkpoint_dir when left empty: runs/<config stem>-<rank 0's local
// time>, and <run_dir>/checkpoints. Collective: every rank gets rank 0's time.
Config resolve_run_layout(Config config, Communicator* comm);

// Throws unless the run can write everything it will: train.run_dir and train.checkpoint_dir are
// directories (or can be created) that take files, and train.trace and `json_path` (--json), when
// set, can be written. For rank 0, the one that writes them, before the first step (not after the
// last).
void require_writable_run_layout(const Config& config, const std::string& json_path);

// runs/latest -> the run dir. A real directory there (an older layout) is left alone.
void point_latest_at(const std::string& run_dir);

// " key=value" for every fusion.*, comm.* and inference.fold_bn key that differs from its default.
std::string non_default_settings(const Config& config);

// <checkpoint_dir>/step_000042.safetensors.
std::string checkpoint_path(const Config& config, int step);

// A fresh run must not write its step_N files over another run's: rank 0 looks (it is the one
// that writes), every rank follows its answer. Throws ft::Error naming train.overwrite.
void refuse_to_overwrite(const Config& config, Communicator* comm, bool is_root);

// JSON Lines output that fails loudly: a full disk or a closed pipe is an error naming the path,
// not a silently truncated file.
class JsonLinesFile {
 public:
  void open(const std::string& path);
  bool is_open() const { return out_.is_open(); }
  void write(const nlohmann::json& row, bool flush = false);
  // Flushes and closes; REQUIRES: is_open().
  void close();

 private:
  void require_good();
  std::string path_;
  std::ofstream out_;
};

}  // namespace ft
