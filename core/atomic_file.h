// Whole-file I/O that never leaves a half-written file at the destination: bytes go to
// "<path>.tmp.<pid>", are fsync'ed, renamed over `path`, and the directory is fsync'ed, so a crash
// leaves either the old file or the new one. Every failure throws ft::Error naming the path and
// the OS reason (errno text).
// Thread safety: calls on distinct paths are safe from any thread; two threads of one process must
// not write the same path at once (they would share the temp name).
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace ft {

// Streams bytes into a temp file and publishes them at `path` only on commit(). Lets a large
// checkpoint be written piece by piece without first assembling it in memory.
// If destroyed without a successful commit(), the temp file is removed and `path` is untouched.
class AtomicFileWriter {
 public:
  // Creates missing parent directories and opens "<path>.tmp.<pid>" (truncating a stale one).
  // Throws, before creating anything, when `path` is not a writable target
  // (resolve_output_target).
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();  // never throws
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // REQUIRES: commit() has not been called; `data` holds `size` readable bytes (null when size 0).
  void append(const void* data, size_t size);
  // fsync the file, rename it over `path`, fsync the directory. REQUIRES: called at most once.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  // Closes and removes the temp file, then throws ft::Error for `what` with errno `err`.
  [[noreturn]] void fail(const std::string& what, int err);

  std::string path_;  // the file written: the target of a symbolic link, never the link
  std::string temp_path_;
  int fd_ = -1;
  int slot_ = -1;          // its entry for remove_temp_files_in_progress, or -1
  bool finished_ = false;  // committed or failed: the destructor has nothing to clean up
};

// Where an atomic output to `path` goes, checked before any work: `path` itself when nothing or a
// regular file is there, the file a symbolic link points to (a link is followed, never replaced),
// and an ft::Error beginning with `what` and the path for anything else (a device such as
// /dev/null, a directory, a pipe, a dangling link): renaming over those would replace them.
std::string resolve_output_target(const std::string& path, const std::string& what);

// Removes the temp files of writers still in progress in this process. Async-signal-safe: the
// SIGINT/SIGTERM handler calls it before _exit, so an interrupted checkpoint leaves nothing.
void remove_temp_files_in_progress() noexcept;

// Writes `bytes` to `path` atomically (see above). Creates missing parent directories.
void write_file_atomic(const std::string& path, const std::string& bytes);

// Removes the temp files ("<name>.tmp.<pid>") that writers which died before commit() left in
// `directory`: only those whose pid is no longer alive (kill(pid, 0) fails with ESRCH); a temp
// file of a live process, or one whose suffix is not a pid, is left alone. Returns the removed
// paths. A missing directory holds nothing to remove. Pids are this host's: a temp file on a
// shared filesystem written by a process on another host may be taken for a dead one.
std::vector<std::string> remove_stale_temp_files(const std::string& directory);

// Returns the whole content of `path`; throws ft::Error naming the path when it cannot be read.
std::string read_file(const std::string& path);

// What a file that is not a regular one is, for messages: "a directory", "a pipe", ...
const char* file_kind(mode_t mode);

// Creates the missing folders above `path` (every output's rule); throws ft::Error naming the path.
void create_parent_directories(const std::string& path);

// Writes `text` to `path` (a --json output: not atomic, so /dev/stdout and pipes work) and throws
// ft::Error naming the path and the system's reason when opening, writing or closing fails (a full
// disk included), instead of leaving a short file behind a zero exit.
void write_output_file(const std::string& path, const std::string& text);

}  // namespace ft
