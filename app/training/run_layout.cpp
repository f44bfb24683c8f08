#include "app/training/run_layout.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "app/cli/flag_checks.h"
#include "core/atomic_file.h"
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

// "20261201-233523": local time, as run directories are named.
std::string local_stamp(std::time_t time) {
  char stamp[32];
  std::tm local{};
  localtime_r(&time, &local);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
  return stamp;
}

// `base` for suffix 1, else "base-<suffix>".
std::string suffixed(const std::string& base, int suffix) {
  return suffix > 1 ? base + "-" + std::to_string(suffix) : base;
}

// Claims `base`, else base-2, -3, ...: mkdir either creates the directory or fails with EEXIST,
// so two runs started in the same second never share one. Returns the suffix (1: none).
int claim_directory(const std::string& base, const std::string& what) {
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(base).parent_path(), error);
  for (int suffix = 1;; ++suffix) {
    const std::string path = suffixed(base, suffix);
    if (::mkdir(path.c_str(), 0777) == 0) return suffix;
    const int err = errno;
    FT_REQUIRE(err == EEXIST && suffix < 10000, "cannot create ", what, " '", path,
               "': ", std::strerror(err));
  }
}

// train.overwrite on a fresh run: the previous run's checkpoints move into
// <directory>/replaced-<time>[-N]/ instead of staying beside the new ones, where a resume from
// "the newest" could pick a file of the other run; nothing is deleted. Says what moved where.
void set_aside_checkpoints(const std::string& directory) {
  namespace fs = std::filesystem;
  if (count_checkpoints(directory) == 0) return;
  const std::string base =
      (fs::path(directory) / ("replaced-" + local_stamp(std::time(nullptr)))).string();
  const fs::path aside = suffixed(base, claim_directory(base,
                                                        "the folder for the previous "
                                                        "run's checkpoints (train.overwrite)"));
  int moved = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::error_code error;
    fs::rename(entry.path(), aside / entry.path().filename(), error);
    FT_REQUIRE(!error, "train.overwrite: cannot move '", entry.path().string(), "' into '",
               aside.string(), "': ", error.message());
    ++moved;
  }
  std::printf("note: train.overwrite: moved the previous run's %d checkpoint(s) to %s\n", moved,
              aside.string().c_str());
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

// runs/<config stem>-<YYYYmmdd-HHMMSS of `start`, local time>.
std::string run_dir_base(const Config& config, std::time_t start) {
  const std::string stem = std::filesystem::path(config.source_path).stem().string();
  return "runs/" + (stem.empty() ? std::string("run") : stem) + "-" + local_stamp(start);
}

// train.run_dir and train.checkpoint_dir when left empty: runs/<config stem>-<rank 0's local
// time>[-N], created here by rank 0, and <run_dir>/checkpoints. Every rank gets rank 0's name.
Config resolve_run_layout(Config config, Communicator* comm, bool is_root) {
  if (config.train.run_dir.empty()) {
    float now[2] = {0, 0};  // seconds since the epoch, split so that floats hold it exactly
    const long long seconds = static_cast<long long>(std::time(nullptr));
    now[0] = static_cast<float>(seconds >> 16);
    now[1] = static_cast<float>(seconds & 0xffff);
    if (comm != nullptr) comm->broadcast(now, 2, 0);
    const std::time_t start =
        (static_cast<std::time_t>(now[0]) << 16) | static_cast<std::time_t>(now[1]);
    const std::string base = run_dir_base(config, start);
    float suffix = is_root ? static_cast<float>(claim_directory(
                                 base,
                                 "the run directory (set train.run_dir to one that can be "
                                 "created)"))
                           : 0;
    if (comm != nullptr) comm->broadcast(&suffix, 1, 0);
    config.train.run_dir = suffixed(base, static_cast<int>(suffix));
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

// runs/latest -> the run dir, when the run dir was named automatically. A real file or directory
// there (an older layout, or the user's) is left alone, with a note saying so.
void point_latest_at(const std::string& run_dir) {
  const std::filesystem::path latest = std::filesystem::path(run_dir).parent_path() / "latest";
  std::error_code error;
  if (std::filesystem::exists(latest, error) && !std::filesystem::is_symlink(latest, error)) {
    std::printf("note: %s is not a symlink, so it was left alone and does not point at this run\n",
                latest.string().c_str());
    return;
  }
  std::filesystem::remove(latest, error);
  std::filesystem::create_directory_symlink(std::filesystem::path(run_dir).filename(), latest,
                                            error);
  if (error)
    std::printf("note: could not point %s at this run: %s\n", latest.string().c_str(),
                error.message().c_str());
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

// A fresh run must not write its step_N files, config.yaml or metrics.jsonl over another run's:
// rank 0 looks (it is the one that writes), every rank follows its answer.
void refuse_to_overwrite(const Config& config, Communicator* comm, bool is_root) {
  if (!config.train.resume.empty()) return;
  if (config.train.overwrite) {
    if (is_root) set_aside_checkpoints(config.train.checkpoint_dir);
    return;
  }
  namespace fs = std::filesystem;
  const fs::path run_dir(config.train.run_dir);
  std::error_code error;
  // First, what a killed earlier attempt left (its first checkpoint's temp file, say), so a
  // refusal below does not keep it there.
  if (is_root)
    for (const std::string& stale : remove_stale_temp_files(config.train.checkpoint_dir))
      std::printf("removed stale temp file %s (its writer is gone)\n", stale.c_str());
  float found[3] = {0, 0, 0};  // checkpoints, config.yaml, metrics.jsonl
  if (is_root) {
    found[0] = static_cast<float>(count_checkpoints(config.train.checkpoint_dir));
    found[1] = fs::exists(run_dir / "config.yaml", error) ? 1 : 0;
    found[2] = fs::exists(run_dir / "metrics.jsonl", error) ? 1 : 0;
  }
  if (comm != nullptr) comm->broadcast(found, 3, 0);
  FT_REQUIRE(found[0] == 0, "train.checkpoint_dir '", config.train.checkpoint_dir,
             "' already holds ", static_cast<int>(found[0]),
             " checkpoint(s) (*.safetensors), and this is a fresh run (no train.resume) that would "
             "overwrite them; resume with train.resume: PATH, choose another "
             "train.checkpoint_dir, or set train.overwrite: true to write there anyway");
  FT_REQUIRE(found[1] == 0 && found[2] == 0, "train.run_dir '", config.train.run_dir,
             "' already holds another run's files (",
             found[1] != 0 && found[2] != 0 ? "config.yaml, metrics.jsonl"
             : found[1] != 0                ? "config.yaml"
                                            : "metrics.jsonl",
             "), and this fresh run (no train.resume) would overwrite them; choose "
             "another train.run_dir (or leave it empty for a new runs/<config stem>-<time>), or "
             "set train.overwrite: true to write there anyway");
}

void JsonLinesFile::open(const std::string& path, bool append) {
  path_ = path;
  create_parent_directories(path);
  out_.open(path, append ? std::ios::app : std::ios::trunc);
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

// The handler may run on any thread at any moment, so it only reads a message prepared earlier:
// update() writes the buffer the handler is not reading and then publishes it with one atomic
// store, and the handler uses write() and _exit(), which are async-signal-safe (printf, exit and
// the stream destructors are not).
namespace {
constexpr size_t kInterruptMessageBytes = 4096;
char interrupt_messages[2][kInterruptMessageBytes];
std::atomic<int> interrupt_current{-1};  // -1: nothing to print (ranks other than 0)
std::atomic<int> interrupt_log_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads it");

void write_all(int fd, const char* text, size_t bytes) {
  while (bytes > 0) {
    const ssize_t wrote = ::write(fd, text, bytes);
    if (wrote <= 0) return;
    text += wrote;
    bytes -= static_cast<size_t>(wrote);
  }
}

std::atomic<int> interrupt_requested{0};  // the first SIGINT or SIGTERM, 0 before one

void write_to_outputs(const char* text) {
  for (const int fd : {STDERR_FILENO, interrupt_log_fd.load()})
    if (fd >= 0) write_all(fd, text, std::strlen(text));
}

extern "C" void on_interrupt(int signo) {
  const bool printing = interrupt_current.load() >= 0;
  int none = 0;
  if (interrupt_requested.compare_exchange_strong(none, signo)) {
    if (printing)
      write_to_outputs(signo == SIGINT
                           ? "SIGINT: stopping after this step and saving a checkpoint (send it "
                             "again to stop at once)\n"
                           : "SIGTERM: stopping after this step and saving a checkpoint (send it "
                             "again to stop at once)\n");
    return;
  }
  if (printing) {
    write_to_outputs(signo == SIGINT ? "interrupted by SIGINT again"
                                     : "interrupted by SIGTERM again");
    write_to_outputs(interrupt_messages[interrupt_current.load()]);
  }
  remove_temp_files_in_progress();  // a checkpoint cut short leaves no temp file behind
  ::_exit(128 + signo);
}
}  // namespace

InterruptHandlers::InterruptHandlers(bool print, int log_fd) {
  interrupt_log_fd.store(print ? log_fd : -1);
  interrupt_requested.store(0);
  print_ = print;
  if (print) update(0, "", "");
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  for (const int signo : {SIGINT, SIGTERM}) ::sigaction(signo, &action, nullptr);
}

InterruptHandlers::~InterruptHandlers() {
  for (const int signo : {SIGINT, SIGTERM}) ::signal(signo, SIG_DFL);
  interrupt_current.store(-1);
  interrupt_log_fd.store(-1);
}

int InterruptHandlers::requested() {
  return interrupt_requested.load();
}

void InterruptHandlers::update(int step, const std::string& last_checkpoint,
                               const std::string& resume_hint) {
  if (!print_) return;
  const int next = interrupt_current.load() == 0 ? 1 : 0;
  if (last_checkpoint.empty())
    std::snprintf(interrupt_messages[next], kInterruptMessageBytes,
                  " at step %d; no checkpoint written yet\n", step);
  else
    std::snprintf(interrupt_messages[next], kInterruptMessageBytes,
                  " at step %d; last checkpoint %s\nresume with: %s\n", step,
                  last_checkpoint.c_str(), resume_hint.c_str());
  interrupt_current.store(next);
}

std::string checkpoint_path(const Config& config, int step) {
  char name[64];
  std::snprintf(name, sizeof(name), "step_%06d.safetensors", step);
  return (std::filesystem::path(config.train.checkpoint_dir) / name).string();
}

}  // namespace ft
