// Where a training run writes, and what it says about itself at start: the run directory
// (runs/<config stem>-<timestamp> with runs/latest pointing at it), checkpoint names, the check
// that every output is writable, the refusal to write over another run's files, JSON Lines
// output that fails loudly, and the short start summary's list of settings that differ from the
// defaults, and the message a SIGINT or SIGTERM leaves. Used by app/jobs/train_job.cpp.
// Thread safety: called from the training thread; collective where a Communicator is passed.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "app/config/config.h"
#include "comm/communicator.h"

namespace ft {

// "1:05" or "1:02:05".
std::string clock_text(double seconds);

// train.run_dir and train.checkpoint_dir when left empty: runs/<config stem>-<rank 0's local
// time>, with -2, -3, ... appended when that exists (rank 0 creates the directory with mkdir, so
// two runs started in the same second never share it), and <run_dir>/checkpoints. Collective:
// every rank gets rank 0's name.
Config resolve_run_layout(Config config, Communicator* comm, bool is_root);

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

// A fresh run must not write its step_N files, config.yaml or metrics.jsonl over another run's:
// rank 0 looks (it is the one that writes), every rank follows its answer. Throws ft::Error
// naming train.overwrite. With train.overwrite, rank 0 instead moves the checkpoints it finds
// into <checkpoint_dir>/replaced-<time>/, so the new run's never mix with them.
void refuse_to_overwrite(const Config& config, Communicator* comm, bool is_root);

// SIGINT and SIGTERM ask the run to stop: the first only sets requested(), which the training
// loop reads after each step (it then saves a checkpoint and says how to resume), and with
// `print` (rank 0) says so on stderr and `log_fd` (when >= 0). A second one ends the process at
// once with exit status 128 + signo, removing any temp file in progress, after (with `print`)
// "interrupted by SIGINT again at step N; last checkpoint PATH" and the resume hint. The handler
// may run on any thread, so it only writes messages prepared by update(); metrics and log rows
// must be flushed as they are written. One instance at a time; the destructor restores the
// default actions.
class InterruptHandlers {
 public:
  InterruptHandlers(bool print, int log_fd);
  ~InterruptHandlers();
  InterruptHandlers(const InterruptHandlers&) = delete;
  InterruptHandlers& operator=(const InterruptHandlers&) = delete;
  // The step last finished, the newest checkpoint ("" when none yet) and the command that
  // resumes from it, for the message of a second signal.
  void update(int step, const std::string& last_checkpoint, const std::string& resume_hint);
  // The first SIGINT or SIGTERM received since construction, or 0.
  static int requested();

 private:
  bool print_ = false;
};

// JSON Lines output that fails loudly: a full disk or a closed pipe is an error naming the path,
// not a silently truncated file.
class JsonLinesFile {
 public:
  // `append`: keep what the file holds (a resumed run adds to its history).
  void open(const std::string& path, bool append = false);
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
