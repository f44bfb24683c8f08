// Error reporting for fusiontrain: FT_CHECK throws ft::Error carrying file:line and a message.
// Errors that reach main() print and exit non-zero; destructors never throw.
// Thread safety: stateless, safe from any thread.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace ft {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// An allocation the machine cannot satisfy (host, GPU or pinned memory): a size from the config
// or flags, so callers that know which keys drove it (app/training/task.cpp) catch it to say so.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& what) : Error(what) {}
};

// An error every rank raises at the same point of the same step, because the ranks decided it
// together (a vote on divergence): rank 0 alone reports it, and no rank has to abort the others.
class CollectiveError : public Error {
 public:
  explicit CollectiveError(const std::string& what) : Error(what) {}
};

// A bad flag value or combination on the command line: main() exits with 2, as for the flags
// CLI11 itself refuses, where every other error exits with 1.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& what) : Error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace ft

// Throws ft::Error("file:line: check `cond` failed: <message>") when cond is false.
#define FT_CHECK(cond, ...)                                                               \
  do {                                                                                    \
    if (!(cond))                                                                          \
      throw ::ft::Error(::ft::detail::concat(__FILE__, ":", __LINE__, ": check `", #cond, \
                                             "` failed: ", ##__VA_ARGS__));               \
  } while (0)

// Throws ft::Error with just the message: for user-facing errors (config, files, flags).
#define FT_FAIL(...) throw ::ft::Error(::ft::detail::concat(__VA_ARGS__))

// FT_FAIL(message) when cond is false: the check for user input (files, flags, metadata), whose
// message must name the input, not our source.
#define FT_REQUIRE(cond, ...)          \
  do {                                 \
    if (!(cond)) FT_FAIL(__VA_ARGS__); \
  } while (0)

// FT_FAIL and FT_REQUIRE for a command-line flag: ft::UsageError, exit status 2.
#define FT_USAGE_FAIL(...) throw ::ft::UsageError(::ft::detail::concat(__VA_ARGS__))
#define FT_USAGE_REQUIRE(cond, ...)          \
  do {                                       \
    if (!(cond)) FT_USAGE_FAIL(__VA_ARGS__); \
  } while (0)
