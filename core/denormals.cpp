#include "core/denormals.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace ft {
namespace {

void set_this_thread() {
#if defined(__SSE__)
  constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;
  _mm_setcsr(_mm_getcsr() | kFlushToZero | kDenormalsAreZero);
#endif
}

}  // namespace

void flush_denormals_to_zero() {
  set_this_thread();
#pragma omp parallel
  set_this_thread();
}

}  // namespace ft
