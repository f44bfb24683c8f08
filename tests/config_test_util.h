// Shared by tests/config_test.cpp and tests/config_rules_test.cpp: the source directory and the
// message of the ft::Error a config parse throws.
// Thread safety: none needed; tests call these from one thread.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "app/config/config.h"
#include "core/check.h"

namespace ft::config_test {

inline const std::string kSource = FT_SOURCE_DIR;

// The message of the ft::Error that `action` throws; fails the test if it throws none.
template <typename Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an ft::Error";
  return "";
}

inline std::string parse_error(const std::string& yaml,
                               const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(yaml, "test.yaml", overrides); });
}

}  // namespace ft::config_test
