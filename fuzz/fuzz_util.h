// Shared by the libFuzzer targets in fuzz/: an input as a file (a memfd, so nothing touches the
// disk and no file is left behind), and the one rule every target follows: ft::Error is a clean
// refusal, anything else escaping a parser is a finding (libFuzzer reports the uncaught exception
// as a crash, std::bad_alloc included).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace ft_fuzz {

// A memfd holding `bytes`, open for as long as the object lives; path() reopens it from the
// start (/proc/self/fd/N), so a reader sees a regular file of exactly bytes.size() bytes.
class MemFile {
 public:
  MemFile(const void* bytes, size_t size) {
    fd_ = ::memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) die("memfd_create");
    const char* data = static_cast<const char*>(bytes);
    size_t done = 0;
    while (done < size) {
      const ssize_t wrote = ::write(fd_, data + done, size - done);
      if (wrote <= 0) die("write to memfd");
      done += static_cast<size_t>(wrote);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] static void die(const char* what) {
    std::perror(what);
    std::abort();
  }
  int fd_ = -1;
  std::string path_;
};

// A broken invariant of ours (not a refusal): print it and abort, so libFuzzer saves the input.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Config parsing prints notes (optim.warmup_steps fitted to train.steps) on stdout; libFuzzer
// reports on stderr, so stdout goes nowhere.
inline void silence_stdout() {
  if (std::freopen("/dev/null", "w", stdout) == nullptr) std::perror("freopen /dev/null");
}

}  // namespace ft_fuzz
