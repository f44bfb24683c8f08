// Shared by the safetensors tests (tests/safetensors_test.cpp, safetensors_bf16_test.cpp): the
// message of the error an action throws, for checks of what a refusal names.
#pragma once
#include <functional>
#include <string>

#include "core/check.h"

namespace ft {
namespace safetensors_test {

// The message of the ft::Error thrown by `action`, or a marker that fails every substring check.
inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no ft::Error thrown>";
}

}  // namespace safetensors_test
}  // namespace ft
