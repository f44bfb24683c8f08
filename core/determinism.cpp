#include "core/determinism.h"

namespace ft {
namespace {

bool deterministic_enabled = false;

}  // namespace

void set_deterministic_algorithms(bool on) {
  deterministic_enabled = on;
}

bool deterministic_algorithms() {
  return deterministic_enabled;
}

}  // namespace ft
