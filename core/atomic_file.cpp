#include "core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/check.h"

namespace ft {
namespace {

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

std::string parent_directory(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// The temp files being written now, for remove_temp_files_in_progress: fixed slots a signal
// handler can read without locks or allocation. A writer claims a slot, copies its path in, and
// only then marks it ready, which is all the handler looks at.
constexpr int kTempSlots = 8;
char temp_slot_paths[kTempSlots][PATH_MAX];
std::atomic<bool> temp_slot_claimed[kTempSlots];
std::atomic<bool> temp_slot_ready[kTempSlots];
static_assert(std::atomic<bool>::is_always_lock_free, "read by a signal handler");

int claim_temp_slot(const std::string& temp_path) {
  if (temp_path.size() >= PATH_MAX) return -1;
  for (int slot = 0; slot < kTempSlots; ++slot) {
    bool expected = false;
    if (!temp_slot_claimed[slot].compare_exchange_strong(expected, true)) continue;
    std::memcpy(temp_slot_paths[slot], temp_path.c_str(), temp_path.size() + 1);
    temp_slot_ready[slot].store(true);
    return slot;
  }
  return -1;  // more writers at once than slots: this one is not cleaned up on a signal
}

void release_temp_slot(int slot) {
  if (slot < 0) return;
  temp_slot_ready[slot].store(false);
  temp_slot_claimed[slot].store(false);
}

}  // namespace

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

void create_parent_directories(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec)
    FT_FAIL("cannot write '", path, "': creating directory '", parent.string(),
            "' failed: ", ec.message());
}

std::string resolve_output_target(const std::string& path, const std::string& what) {
  if (path.empty() || std::filesystem::path(path).filename().empty())
    FT_FAIL(what, " '", path, "': not a file path (empty or ends with '/')");
  struct stat link_info {};
  if (::lstat(path.c_str(), &link_info) != 0) return path;  // nothing there yet
  if (S_ISREG(link_info.st_mode)) return path;
  if (!S_ISLNK(link_info.st_mode))
    FT_FAIL(what, " '", path, "': it exists and is ", file_kind(link_info.st_mode),
            ", not a regular file, so it cannot be replaced by the output; choose another path");
  // A symbolic link is followed: the output replaces the file it points to, never the link.
  struct stat target_info {};
  if (::stat(path.c_str(), &target_info) != 0)
    FT_FAIL(what, " '", path, "': it is a symbolic link to a missing file (", errno_text(errno),
            "); choose another path");
  if (!S_ISREG(target_info.st_mode))
    FT_FAIL(what, " '", path, "': it is a symbolic link to ", file_kind(target_info.st_mode),
            ", not a regular file, so it cannot be replaced by the output; choose another path");
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::canonical(path, ec);
  if (ec) FT_FAIL(what, " '", path, "': cannot resolve the symbolic link: ", ec.message());
  return target.string();
}

void remove_temp_files_in_progress() noexcept {
  for (int slot = 0; slot < kTempSlots; ++slot)
    if (temp_slot_ready[slot].load()) ::unlink(temp_slot_paths[slot]);
}

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(resolve_output_target(path, "cannot write")),
      temp_path_(path_ + ".tmp." + std::to_string(::getpid())) {
  std::error_code ec;
  std::filesystem::create_directories(parent_directory(path), ec);
  if (ec)
    FT_FAIL("cannot write '", path, "': creating directory '", parent_directory(path),
            "' failed: ", ec.message());
  // O_TRUNC, not O_EXCL: a temp file left by a crashed run whose pid was reused must not block us.
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd_ >= 0) slot_ = claim_temp_slot(temp_path_);
  if (fd_ < 0) {
    int err = errno;
    FT_FAIL("cannot write '", path, "': creating temp file '", temp_path_,
            "' failed: ", errno_text(err));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  release_temp_slot(slot_);
  if (finished_) return;
  if (fd_ >= 0) ::close(fd_);
  ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
  release_temp_slot(slot_);
  slot_ = -1;
  finished_ = true;
  FT_FAIL("cannot write '", path_, "': ", what, " failed: ", errno_text(err));
}

void AtomicFileWriter::append(const void* data, size_t size) {
  FT_CHECK(fd_ >= 0 && !finished_, "append to '", path_, "' after commit or failure");
  const char* cursor = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t written = ::write(fd_, cursor, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("writing temp file '" + temp_path_ + "'", errno);
    }
    cursor += written;
    size -= static_cast<size_t>(written);
  }
}

void AtomicFileWriter::commit() {
  FT_CHECK(fd_ >= 0 && !finished_, "commit of '", path_, "' called twice or after failure");
  if (::fsync(fd_) != 0) fail("fsync of temp file '" + temp_path_ + "'", errno);
  // close() can be the first to report a deferred write error (e.g. on NFS).
  int close_result = ::close(fd_);
  fd_ = -1;
  if (close_result != 0) fail("closing temp file '" + temp_path_ + "'", errno);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
    fail("renaming '" + temp_path_ + "' over it", errno);
  release_temp_slot(slot_);
  slot_ = -1;
  finished_ = true;

  // Without this the rename itself may be lost on power failure.
  std::string directory = parent_directory(path_);
  int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    int err = errno;
    FT_FAIL("cannot write '", path_, "': opening directory '", directory,
            "' for fsync failed: ", errno_text(err));
  }
  int sync_result = ::fsync(dir_fd);
  int sync_errno = errno;
  ::close(dir_fd);
  // EINVAL/ENOTSUP: the filesystem cannot sync directories at all; the data itself is safe.
  if (sync_result != 0 && sync_errno != EINVAL && sync_errno != ENOTSUP)
    FT_FAIL("cannot write '", path_, "': fsync of directory '", directory,
            "' failed: ", errno_text(sync_errno));
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFileWriter writer(path);
  writer.append(bytes.data(), bytes.size());
  writer.commit();
}

std::vector<std::string> remove_stale_temp_files(const std::string& directory) {
  std::vector<std::string> removed;
  std::error_code ec;
  std::filesystem::directory_iterator it(directory, ec);
  if (ec) return removed;  // missing or unreadable: nothing we could have left there
  for (const std::filesystem::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    const size_t marker = name.rfind(".tmp.");
    if (marker == std::string::npos || marker == 0) continue;
    const char* first = name.data() + marker + 5;
    const char* last = name.data() + name.size();
    long pid = 0;
    const auto [end, parse_error] = std::from_chars(first, last, pid);
    if (parse_error != std::errc() || end != last || first == last || pid <= 0 || pid > INT_MAX)
      continue;
    if (static_cast<pid_t>(pid) == ::getpid()) continue;                      // ours, and in use
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or EPERM)
    std::error_code type_error;
    if (!entry.is_regular_file(type_error)) continue;
    if (::unlink(entry.path().c_str()) == 0) removed.push_back(entry.path().string());
  }
  return removed;
}

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    FT_FAIL("cannot read '", path, "': ", errno_text(err));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    int err = errno;
    ::close(fd);
    FT_FAIL("cannot read '", path, "': fstat failed: ", errno_text(err));
  }
  // Size from fstat, then read until EOF: files in /proc report 0, and a file may still grow.
  std::string bytes(info.st_size > 0 ? static_cast<size_t>(info.st_size) : 0, '\0');
  size_t filled = 0;
  char overflow[1 << 16];
  for (;;) {
    bool into_overflow = filled == bytes.size();
    char* target = into_overflow ? overflow : &bytes[filled];
    size_t room = into_overflow ? sizeof(overflow) : bytes.size() - filled;
    ssize_t got = ::read(fd, target, room);
    if (got < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      FT_FAIL("cannot read '", path, "': ", errno_text(err));
    }
    if (got == 0) break;
    if (into_overflow) {
      bytes.append(overflow, static_cast<size_t>(got));
    }
    filled += static_cast<size_t>(got);
  }
  ::close(fd);
  bytes.resize(filled);
  return bytes;
}

void write_output_file(const std::string& path, const std::string& text) {
  create_parent_directories(path);
  errno = 0;
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) FT_FAIL("cannot open '", path, "' for writing: ", std::strerror(errno));
  const size_t written = std::fwrite(text.data(), 1, text.size(), file);
  const int write_errno = errno;
  const bool flushed = std::fflush(file) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(file) == 0;
  if (written != text.size() || !flushed || !closed)
    FT_FAIL("cannot write '", path, "': ",
            std::strerror(written != text.size() ? write_errno
                          : !flushed             ? flush_errno
                                                 : errno));
}

}  // namespace ft
