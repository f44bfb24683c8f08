#include "core/capture_guard.h"

#include "core/check.h"

namespace ft {
namespace {

thread_local bool capturing_now = false;

}  // namespace

void set_capturing(bool on) {
  FT_CHECK(!(on && capturing_now), "a CUDA-graph capture began inside another");
  capturing_now = on;
}

bool capturing() {
  return capturing_now;
}

void require_not_capturing(const char* what) {
  FT_CHECK(!capturing_now, what,
           " makes the host wait, which a CUDA-graph capture cannot hold: move it out of the "
           "captured step (before begin_capture or after the replay)");
}

}  // namespace ft
