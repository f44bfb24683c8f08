#include "app/cli/flag_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include "app/config/config_schema.h"
#include "core/atomic_file.h"
#include "core/check.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

// Throws unless `directory` takes a new file. access(W_OK) is not enough: root passes it for
// /proc and for read-only mounts alike, so a probe is created and removed. Its name has the
// "<name>.tmp.<pid>" form of AtomicFileWriter's temp files, so that remove_stale_temp_files
// clears it should this process die in between.
void require_creatable_in(const std::string& what, const std::string& path,
                          const fs::path& directory) {
  const fs::path probe = directory / (".write_check.tmp." + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    FT_FAIL(what, " '", path, "': cannot create files in directory '", directory.string(),
            "': ", std::strerror(err));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

// `directory` itself, or the closest directory above it that exists: where create_directories
// starts. A path whose lookup fails for another reason than absence (no permission) stops the
// walk, so the probe there reports it.
fs::path nearest_existing(fs::path directory) {
  std::error_code error;
  while (!directory.empty() && fs::status(directory, error).type() == fs::file_type::not_found &&
         directory != directory.parent_path())
    directory = directory.parent_path();
  return directory.empty() ? fs::path(".") : directory;
}

// Throws unless `directory` (the nearest existing one when `create` is set) is a directory that
// takes new files.
void require_directory_takes_files(const std::string& what, const std::string& path,
                                   const fs::path& directory, bool create) {
  const fs::path existing = create ? nearest_existing(directory) : directory;
  std::error_code error;
  const fs::file_status status = fs::status(existing, error);
  if (status.type() == fs::file_type::not_found)
    FT_FAIL(what, " '", path, "': directory '", existing.string(), "' does not exist");
  if (!error && status.type() != fs::file_type::directory)
    FT_FAIL(what, " '", path, "': '", existing.string(), "' is not a directory");
  require_creatable_in(what, path, existing);
}

}  // namespace

DType dtype_flag(const std::string& flag, const std::string& value) {
  FT_USAGE_REQUIRE(value == "fp32" || value == "bf16", flag, ": expected one of fp32, bf16, got '",
                   value, "'");
  return value == "bf16" ? DType::kBF16 : DType::kF32;
}

void require_key_range(const std::string& flag, const std::string& key, const std::string& text) {
  const config_schema::Field* field = config_schema::find_field(key);
  FT_CHECK(field != nullptr, "no config key '", key, "' for ", flag);
  // The key's own parser on a scratch config: the flag gets exactly the key's range and rounding.
  Config scratch;
  const std::string problem = config_schema::assign_value(*field, scratch, text, false);
  FT_USAGE_REQUIRE(problem.empty(), flag, ": ", problem, " (the range of ", key, ")");
}

void require_key_range(const std::string& flag, const std::string& key, int value) {
  require_key_range(flag, key, std::to_string(value));
}

void require_key_range(const std::string& flag, const std::string& key, double value) {
  char text[64];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  require_key_range(flag, key, std::string(text, end.ptr));
}

void require_writable_file(const std::string& what, const std::string& path, OutputWrite how) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  FT_REQUIRE(status.type() != fs::file_type::directory, what, " '", path,
             "' is a directory; give a file path");
  FT_REQUIRE(!path.empty() && !fs::path(path).filename().empty(), what, " '", path,
             "': not a file path (empty or ends with '/')");
  if (how == OutputWrite::kAtomic) {
    // A rename replaces whatever is there: only a regular file (or a link to one) may be.
    const std::string target = resolve_output_target(path, what);
    const fs::path parent = fs::path(target).parent_path();
    require_directory_takes_files(what, path, parent.empty() ? fs::path(".") : parent, true);
    return;
  }
  const fs::path parent = fs::path(path).parent_path();
  const fs::path directory = parent.empty() ? fs::path(".") : parent;
  // One rule for every output: missing folders are created, as for atomic outputs.
  if (status.type() == fs::file_type::not_found) {
    require_directory_takes_files(what, path, directory, true);
    return;
  }
  // An existing file is written where it is (/dev/stdout included); a FIFO would block this open
  // until a reader comes, so it is left to the write.
  if (status.type() == fs::file_type::fifo) return;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    FT_FAIL(what, " '", path, "': cannot open it for writing: ", std::strerror(err));
  }
  ::close(fd);
}

void require_writable_directory(const std::string& what, const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  FT_REQUIRE(status.type() == fs::file_type::not_found ||
                 status.type() == fs::file_type::directory || error,
             what, " '", path, "' exists and is not a directory");
  require_directory_takes_files(what, path, path, true);
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) {
    const bool same = fs::equivalent(a, b, error);
    return same && !error;
  }
  const fs::path canonical_a = fs::weakly_canonical(a, error);
  if (error) return false;
  const fs::path canonical_b = fs::weakly_canonical(b, error);
  return !error && canonical_a == canonical_b;
}

}  // namespace ft
