// Checks of job flags that CLI11 cannot make, run before a job does any work: a flag that stands in
// for a config key takes that key's range (from the schema, so the two cannot drift), every output
// path is writable before hours of work are spent on what it will hold, and an output is not one of
// the job's inputs. Each failure throws ft::Error naming the flag or key, the value and what is
// allowed. Used by app/cli/main.cpp and the jobs.
// Thread safety: reads the filesystem and creates (then removes) probe files; safe from any thread
// on distinct paths.
#pragma once
#include <string>

#include "core/tensor.h"

namespace ft {

// The dtype a flag names: "fp32" or "bf16" (--dtype, --precision). Throws a usage error naming
// `flag`, the value and both allowed values otherwise.
DType dtype_flag(const std::string& flag, const std::string& value);

// Throws unless config key `key` accepts `text`: "--threads: expected an integer in [0, 256], got
// 100000 (the range of train.threads)". REQUIRES: `key` is a config key
// (app/config/config_fields.cpp).
void require_key_range(const std::string& flag, const std::string& key, const std::string& text);
void require_key_range(const std::string& flag, const std::string& key, int value);
void require_key_range(const std::string& flag, const std::string& key, double value);

// How a job writes an output file, which decides what must exist beforehand.
enum class OutputWrite {
  kInPlace,  // opened at its path (write_output_file, JSON Lines)
  kAtomic,   // a temp file renamed over it (write_file_atomic)
  // Either way missing directories are created, so every job treats an output path alike.
};

// Throws, naming `what` (the flag or key) and `path`, unless a file can be written at `path`: it
// is no directory, its directory (kAtomic: the nearest existing ancestor) is one this process can
// create files in, and an existing file (kInPlace) opens for writing. Writes nothing there but a
// probe file, removed at once.
void require_writable_file(const std::string& what, const std::string& path, OutputWrite how);

// The same for a directory the job creates and fills (train.run_dir, train.checkpoint_dir): not an
// existing non-directory, and it (or its nearest existing ancestor) takes new files.
void require_writable_directory(const std::string& what, const std::string& path);

// Whether `a` and `b` name one file: std::filesystem::equivalent when both exist, else equal
// weakly_canonical paths.
bool same_file(const std::string& a, const std::string& b);

}  // namespace ft
